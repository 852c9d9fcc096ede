// The pipetrain command: train, bench.
#include <malloc.h>

#include <iostream>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "common/config.h"
#include "common/error.h"
#include "pipeline/bench.h"
#include "pipeline/trainer.h"

namespace pt = pipetrain::pipeline;

int main(int argc, char** argv) {
  // glibc would hand large freed tensors back to the system after every step and fault them
  // in again on the next; keeping them saves about 10% of an MLP step (README, Benchmarks).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum on 64-bit
  mallopt(M_TRIM_THRESHOLD, 1 << 30);

  CLI::App app{"pipetrain: pipeline-parallel training (GPipe) on libtorch", "pipetrain"};
  app.set_version_flag("--version", PIPETRAIN_VERSION);
  app.require_subcommand(1);

  std::string config_path, metrics_path;
  std::vector<std::string> overrides;
  int64_t steps = -1;
  bool quiet = false;
  auto* train = app.add_subcommand("train", "Train the model a config describes and report test accuracy");
  train->add_option("config", config_path, "JSON config file")->required();
  train->add_option("--steps", steps, "Number of training steps (overrides train.steps)")->check(CLI::NonNegativeNumber);
  train->add_option("--set", overrides, "Override a config key: key.path=value (repeatable)");
  train->add_option("--metrics", metrics_path, "Write one JSON object per step to this file");
  train->add_flag("--quiet", quiet, "No progress line");

  pt::BenchOptions bench_options;
  auto* bench = app.add_subcommand("bench", "Time the plain single-device loop and the pipeline side by side");
  bench->add_option("config", config_path, "JSON config file")->required();
  bench->add_option("--set", overrides, "Override a config key: key.path=value (repeatable)");
  bench->add_option("--warmup", bench_options.warmup, "Untimed steps before measuring")->check(CLI::NonNegativeNumber);
  bench->add_option("--repeat", bench_options.repeat, "Timed steps (the median is reported)")->check(CLI::PositiveNumber);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    if (steps >= 0) overrides.push_back("train.steps=" + std::to_string(steps));
    pt::Config config = pt::load_config(config_path, overrides);
    if (*train) {
      pt::Job job = pt::prepare(config);
      pt::TrainResult r = pt::train(job, {metrics_path, !quiet});
      if (r.test_samples > 0)
        std::printf("test accuracy %.4f, test loss %.4f on %lld samples; %.1f samples/s in training\n",
                    r.test_accuracy, r.test_loss, static_cast<long long>(r.test_samples), r.samples_per_s);
      else
        std::printf("final loss %.4f; %.1f samples/s in training\n", r.losses.empty() ? 0.0 : r.losses.back(),
                    r.samples_per_s);
    } else if (*bench) {
      pt::BenchResult r = pt::run_bench(config, bench_options);
      pt::print_bench(std::cout, config, r);
    }
  } catch (const pipetrain::ConfigError& e) {
    std::fprintf(stderr, "pipetrain: error: %s\n", e.what());
    return 2;
  } catch (const pipetrain::Error& e) {
    std::fprintf(stderr, "pipetrain: error: %s\n", e.what());
    return 1;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "pipetrain: error: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipetrain: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
