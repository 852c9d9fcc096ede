// `pipetrain simulate`: a schedule simulated on a cost file: the step, its bubble and each
// device's memory, without running anything.
#include <iostream>

#include "apps/commands.h"
#include "apps/common_options.h"
#include "common/recompute.h"
#include "schedule/kinds.h"
#include "planner/whatif.h"

namespace pipetrain::apps {

namespace {

class Simulate final : public Command {
 public:
  explicit Simulate(CLI::App& app)
      : Command(app.add_subcommand("simulate",
                                   "Simulate a schedule on a cost file: step, bubble, memory per stage")) {
    CLI::App* s = subcommand_;
    s->add_option("--costs", options_.costs_path, "Cost file (plan --save-costs, costs transformer)")
        ->required();
    s->add_option("--stages", options_.stages, "Devices")->required()->check(CLI::Range(1, 100000));
    s->add_option("--micro-batches", options_.micro_batches, "Micro-batches per step")
        ->required()
        ->check(CLI::Range(1, 1000000));
    s->add_option("--schedule", schedule_, "Schedule kind")->check(CLI::IsMember(schedule::kind_names()));
    s->add_option("--chunks", options_.chunks, "Virtual stages per device (default: 2 for kinds with chunks)")
        ->check(CLI::Range(1, 64));
    s->add_option("--recompute", recompute_, "never, always or except_last (as pipeline.recompute)")
        ->check(CLI::IsMember(recompute_modes()));
    s->add_option("--memory-limit", options_.memory_limit,
                  "zb-auto: activation bytes per device (default: twice 1f1b's)")
        ->check(kNonNegative);
    s->add_option("--bandwidth", options_.bandwidth_gb_s, "Link bandwidth in GB/s (instead of the file's)")
        ->check(kNonNegative);
    s->add_option("--latency-ms", options_.latency_ms, "Link latency in ms (instead of the file's)")
        ->check(kNonNegative);
    s->add_option("--trace", trace_path_,
                  "Write the simulated step with memory counters (Chrome trace JSON)");
    s->add_flag("--json", json_, "Print one JSON object");
  }

  int run() override {
    options_.recompute = parse_recompute(recompute_);
    options_.schedule = schedule::parse_kind(schedule_);
    const planner::SimulateReport r = planner::simulate_cost_file(options_);
    if (!trace_path_.empty()) planner::write_simulation_trace(trace_path_, r);
    planner::print_simulation(std::cout, r, json_);
    return 0;
  }

 private:
  planner::SimulateOptions options_;
  // The flags' words, checked by CLI11 against the vocabularies and parsed once given.
  std::string schedule_ = schedule::name(options_.schedule), recompute_ = "never", trace_path_;
  bool json_ = false;
};

}  // namespace

std::unique_ptr<Command> add_simulate(CLI::App& app) { return std::make_unique<Simulate>(app); }

}  // namespace pipetrain::apps
