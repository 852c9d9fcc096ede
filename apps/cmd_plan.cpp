// `pipetrain plan`: the layers profiled (or read from a cost file), partitioned and the step
// predicted for a config; --auto searches the whole space of plans instead.
#include <cstdio>
#include <fstream>
#include <iostream>

#include "apps/commands.h"
#include "apps/common_options.h"
#include "common/error.h"
#include "profiler/profile.h"
#include "schedule/trace.h"
#include "planner/autoplan.h"
#include "planner/plan.h"

namespace pipetrain::apps {

namespace {

class Plan final : public Command {
 public:
  explicit Plan(CLI::App& app)
      : Command(app.add_subcommand("plan",
                                   "Profile the layers, partition them and predict the step of a config")) {
    CLI::App* s = subcommand_;
    config_.add_path(s);
    config_.add_set(s);
    s->add_flag("--json", json_, "Print the plan as JSON");
    s->add_flag("--compare", options_.compare, "Simulate every schedule side by side");
    s->add_option("--trace", trace_path_, "Write the simulated timeline of one step (Chrome trace JSON)");
    s->add_option("--save-costs", save_costs_,
                  "Write the profiled per-layer costs (a cost file for partition)");
    s->add_option("--costs", options_.costs_path, "Use this cost file instead of profiling");
    s->add_option("--repeat", options_.repeat, "Profiling runs per op (the median is used)")
        ->check(kPositive);
    s->add_flag("--auto", auto_,
                "Search stages, micro-batches, schedule, recomputation, precision and balance");
    s->add_option("--devices", auto_options_.devices,
                  "--auto: devices to plan for (default: on a CPU the cores; on GPUs pipeline.stages x "
                  "pipeline.data_parallel; or the cost file's devices)")
        ->check(CLI::Range(1, 4096));
    s->add_option("--cores", auto_options_.cores,
                  "--auto, CPU: cores to share out among stages, copies and intra-op threads (default this machine's)")
        ->check(CLI::Range(1, 4096));
    s->add_option("--memory-limit", auto_options_.memory_limit,
                  "--auto: bytes per device (one, or one per device)")
        ->delimiter(',')
        ->check(kPositive);
    s->add_option("--memory-headroom", auto_options_.memory_headroom,
                  "--auto: share of each limit kept free for what the memory model misses (default 0.05)")
        ->check(CLI::Range(0.0, 0.9));
    s->add_option("--speeds", auto_options_.speeds, "--auto: relative speed of each device")
        ->delimiter(',')
        ->check(kPositive);
    s->add_option("--top", auto_options_.top, "--auto: plans to list (default 5)")
        ->check(CLI::Range(1, 1000));
    s->add_option("--write-config", auto_options_.write_config,
                  "--auto: write the chosen plan as a config here");
  }

  int run() override {
    const job::Config config = config_.load();
    if (auto_)
      search(config);
    else
      predict(config);
    return 0;
  }

 private:
  void search(const job::Config& config) {
    auto_options_.costs_path = options_.costs_path;
    // --repeat left at plan's default keeps the search's own default.
    auto_options_.repeat = options_.repeat == 5 ? 3 : options_.repeat;
    const planner::AutoPlanReport r = planner::auto_plan(config, auto_options_);
    if (json_) {
      planner::print_auto_plan_json(std::cout, r);
    } else {
      planner::print_auto_plan(std::cout, r, auto_options_.top);
      if (!auto_options_.write_config.empty()) std::printf("wrote %s\n", auto_options_.write_config.c_str());
    }
  }

  void predict(const job::Config& config) const {
    const planner::PlanReport r = planner::make_plan(config, options_);
    if (!save_costs_.empty()) profiler::save_costs(save_costs_, r.profile, r.point.ties);
    if (!trace_path_.empty()) {
      std::ofstream f(trace_path_, std::ios::out | std::ios::trunc);
      if (!f) throw ConfigError("--trace " + trace_path_ + ": cannot open for writing");
      schedule::write_chrome_trace(f, {planner::simulated_timeline(config, r)});
      if (!f) throw Error("--trace " + trace_path_ + ": write failed");
    }
    if (json_)
      planner::print_plan_json(std::cout, r);
    else
      planner::print_plan(std::cout, r);
  }

  ConfigOptions config_;
  planner::PlanOptions options_;
  planner::AutoPlanOptions auto_options_;
  std::string trace_path_, save_costs_;
  bool json_ = false, auto_ = false;
};

}  // namespace

std::unique_ptr<Command> add_plan(CLI::App& app) { return std::make_unique<Plan>(app); }

}  // namespace pipetrain::apps
