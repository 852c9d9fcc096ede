// `pipetrain train`: trains the model a config describes (optionally planned first, --auto),
// with the progress line, checkpoints on SIGINT/SIGTERM, and the test result at the end.
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <optional>

#include "apps/commands.h"
#include "apps/common_options.h"
#include "apps/signals.h"
#include "common/error.h"
#include "common/log.h"
#include "planner/autoplan.h"
#include "job/job.h"
#include "train/trainer.h"

namespace pipetrain::apps {

namespace {

class Train final : public Command {
 public:
  explicit Train(CLI::App& app)
      : Command(app.add_subcommand("train", "Train the model a config describes and report test accuracy")) {
    CLI::App* s = subcommand_;
    config_.add_path(s);
    config_.add_steps(s);
    config_.add_set(s);
    s->add_option("--metrics", options_.metrics_path, "Write one JSON object per step to this file");
    s->add_flag("--auto", auto_,
                "Plan first (plan --auto on pipeline.stages devices), print the plan, train it");
    config_.add_quiet(s);
    s->add_option("--trace", options_.trace_path,
                  "Write the measured timeline of the second step (Chrome trace JSON, for Perfetto)");
    s->add_option("--trace-steps", options_.trace_steps, "Steps to put in the --trace timeline")
        ->check(kPositive);
    s->add_option(
        "--tensorboard", options_.tensorboard_dir,
        "Write a TensorBoard log (loss, learning rate, gradient norm, samples/s, stage busy time and bubble, "
        "peak memory per device, test results) into this directory (instead of train.tensorboard)");
    s->add_option(
        "--checkpoint-dir", options_.checkpoint_dir,
        "Save checkpoints here (every train.checkpoint_every steps, at the end, and on SIGINT/SIGTERM)");
    s->add_flag("--resume", options_.resume,
                "Continue from the latest complete checkpoint in the checkpoint directory");
    s->add_option(
         "--until-step", options_.until_step,
         "Stop after this step with a checkpoint, as if interrupted (the schedule still spans train.steps)")
        ->check(kPositive);
  }

  // Started by pipetrain launch on fewer ranks than at first (--min-nproc: a rank's slot is gone):
  // as many stages as the ranks hold copies, the stage count set as a --set would set it; the
  // checkpoint is resumed re-partitioned.
  job::Config shrunk(const job::Config& config) {
    const char* first = std::getenv("PIPETRAIN_SHRUNK");
    const char* world_env = std::getenv("WORLD_SIZE");
    if (!first || !*first || !world_env || config.runtime.kind != job::RuntimeKind::Processes) return config;
    const int world = std::atoi(world_env), D = config.pipeline.data_parallel;
    if (world < 1 || world % D != 0)
      throw ConfigError(detail::concat("pipetrain launch shrank the job to ", world, " ranks, which cannot hold ", D,
                                       " data-parallel copies (pipeline.data_parallel) of equal stages"));
    if (world / D == config.pipeline.stages) return config;
    config_.overrides.push_back(detail::concat("pipeline.stages=", world / D));
    job::Config out = config_.load();
    const char* rank = std::getenv("RANK");
    if (rank && std::string(rank) == "0")
      log::warning(detail::concat("continuing on ", world / D, " stages instead of ", config.pipeline.stages, " (", world,
                                  " of the ", first, " ranks first started; pipetrain launch --min-nproc)"));
    return out;
  }

  int run() override {
    job::Config config = config_.load();
    config = shrunk(config);
    ProgressLine progress = config_.progress(config);
    if (auto_) config = planned(config);
    job::Job job = job::prepare(config);
    options_.observers = {&progress};
    // SIGINT/SIGTERM finish the step and save, when the run saves checkpoints.
    std::optional<StopSignals> signals;
    if (!options_.checkpoint_dir.empty() || !config.train.checkpoint_dir.empty()) signals.emplace();
    options_.stop_requested = [] { return StopSignals::requested(); };
    // Started again by pipetrain launch --max-restarts: the metrics record the restart and why.
    if (const char* restart = std::getenv("PIPETRAIN_RESTART")) {
      options_.restart = std::atoi(restart);
      const char* cause = std::getenv("PIPETRAIN_RESTART_CAUSE");
      options_.restart_cause = cause ? cause : "";
    }
    const train::TrainResult r = train::train(job, options_);
    if (r.stop_request) return 128 + (r.stop_request > 0 ? r.stop_request : SIGTERM);  // -1: a peer's (launch sends SIGTERM)
    if (r.rank > 0) return 0;  // runtime.kind processes: rank 0 reports
    if (r.stopped_at > 0)
      std::printf("stopped at step %lld; checkpoint %s\n", static_cast<long long>(r.stopped_at),
                  r.checkpoint.c_str());
    else if (r.test_samples > 0)
      std::printf("%s; %.1f samples/s in training\n", train::describe_test(r).c_str(), r.samples_per_s);
    else
      std::printf("final loss %.4f; %.1f samples/s in training\n", r.losses.empty() ? 0.0 : r.losses.back(),
                  r.samples_per_s);
    return 0;
  }

 private:
  // --auto: the plan the auto-planner chooses for `config`, printed before the run.
  static job::Config planned(const job::Config& config) {
    if (config.runtime.kind == job::RuntimeKind::Processes)
      throw ConfigError(
          "train --auto: plan with `plan --auto --write-config FILE` and launch the ranks on FILE "
          "(each rank would profile on its own and could choose another plan)");
    const planner::AutoPlanReport r = planner::auto_plan(config, planner::AutoPlanOptions{});
    planner::print_auto_plan(std::cout, r, 3);
    std::cout << "\n" << std::flush;
    return r.chosen;
  }

  ConfigOptions config_;
  train::TrainOptions options_;
  bool auto_ = false;
};

}  // namespace

std::unique_ptr<Command> add_train(CLI::App& app) { return std::make_unique<Train>(app); }

}  // namespace pipetrain::apps
