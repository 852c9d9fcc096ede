// `pipetrain bench`: the plain single-device loop and the pipeline timed side by side, on one
// config or on every combination of the sweep flags.
#include <fstream>
#include <iostream>

#include "apps/commands.h"
#include "apps/common_options.h"
#include "common/error.h"
#include "common/precision.h"
#include "common/recompute.h"
#include "schedule/kinds.h"
#include "train/bench.h"

namespace pipetrain::apps {

namespace {

class Bench final : public Command {
 public:
  explicit Bench(CLI::App& app)
      : Command(
            app.add_subcommand("bench", "Time the plain single-device loop and the pipeline side by side")) {
    CLI::App* s = subcommand_;
    config_.add_path(s);
    config_.add_set(s);
    s->add_option("--warmup", options_.warmup, "Untimed steps before measuring")
        ->check(kNonNegative);
    s->add_option("--repeat", options_.repeat, "Timed steps at least (the median is reported)")
        ->check(kPositive);
    s->add_option("--min-time", options_.min_time_s,
                  "And more timed steps until this many seconds of them (default 0.5; 0: exactly --repeat)")
        ->check(CLI::Range(0.0, 3600.0));
    s->add_option("--stages", sweep_.stages, "Sweep these stage counts (comma-separated)")
        ->delimiter(',')
        ->check(kPositive);
    s->add_option("--micro-batches", sweep_.micro_batches, "Sweep these micro-batch counts")
        ->delimiter(',')
        ->check(kPositive);
    s->add_option("--data-parallel", sweep_.data_parallel,
                  "Sweep these data-parallel copy counts (pipeline.data_parallel)")
        ->delimiter(',')
        ->check(kPositive);
    s->add_option("--recompute", sweep_.recompute, "Sweep these recomputation modes")
        ->delimiter(',')
        ->check(CLI::IsMember(recompute_modes()));
    // Hidden: kept so that the old spelling gets a message that names the new one.
    s->add_option("--checkpoint", old_recompute_flag_, "Renamed --recompute")->group("");
    s->add_option("--schedule", sweep_.schedules, "Sweep these schedules")
        ->delimiter(',')
        ->check(CLI::IsMember(schedule::kind_names()));
    s->add_option("--precision", sweep_.precisions,
                  "Sweep these precisions (train.precision), e.g. fp32,bf16")
        ->delimiter(',')
        ->check(CLI::IsMember(precision_names()));
    s->add_option("--json", json_path_, "Append one JSON object per combination to this file");
  }

  int run() override {
    if (!old_recompute_flag_.empty())
      throw ConfigError("bench --checkpoint: renamed --recompute (the recomputation modes to sweep)");
    const job::Config config = config_.load();
    const bool sweeping = !sweep_.stages.empty() || !sweep_.micro_batches.empty() ||
                          !sweep_.data_parallel.empty() || !sweep_.recompute.empty() ||
                          !sweep_.schedules.empty() || !sweep_.precisions.empty() || !json_path_.empty();
    if (!sweeping) {
      const train::BenchResult r = train::run_bench(config, options_);
      train::print_bench(std::cout, config, r);
      return 0;
    }
    // A list flag left out sweeps the config's own value alone.
    if (sweep_.stages.empty()) sweep_.stages = {config.pipeline.stages};
    if (sweep_.micro_batches.empty()) sweep_.micro_batches = {config.pipeline.micro_batches};
    if (sweep_.recompute.empty()) sweep_.recompute = {recompute_name(config.pipeline.recompute)};
    if (sweep_.schedules.empty()) sweep_.schedules = {schedule::name(config.pipeline.schedule)};
    sweep_.bench = options_;
    sweep_.bench.profile = false;
    std::ofstream json;
    if (!json_path_.empty()) {
      json.open(json_path_, std::ios::out | std::ios::app);
      if (!json) throw ConfigError("--json " + json_path_ + ": cannot open for writing");
    }
    train::run_sweep(config_.path, config_.overrides, sweep_, std::cout, json.is_open() ? &json : nullptr);
    if (json.is_open() && !json.flush()) throw Error("--json " + json_path_ + ": write failed");
    return 0;
  }

 private:
  ConfigOptions config_;
  train::BenchOptions options_;
  train::SweepOptions sweep_;
  std::string old_recompute_flag_, json_path_;
};

}  // namespace

std::unique_ptr<Command> add_bench(CLI::App& app) { return std::make_unique<Bench>(app); }

}  // namespace pipetrain::apps
