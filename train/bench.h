// Side-by-side timing of the plain single-device loop and the pipeline on the same model,
// batch and data, in one process run.
#pragma once

#include <iosfwd>

#include <nlohmann/json.hpp>

#include "pipeline/step_trace.h"
#include "train/trainer.h"

namespace pipetrain::train {

struct BenchOptions {
  int warmup = 3;
  int repeat = 10;
  // Each run also times steps until this many seconds of them have passed (so that the median
  // of a short step is over enough of them), at most kMaxTimedSteps; 0: exactly `repeat`.
  double min_time_s = 0.5;
  bool profile = true;  // also predict the step from per-layer profiles (as `pipetrain plan`)
};

struct BenchMeasure {
  std::string name;
  int threads = 0;               // intra-op threads (per stage for the pipeline)
  int steps = 0;                 // timed steps (repeat, or more for min_time_s)
  double median_step_s = 0;
  double min_step_s = 0, max_step_s = 0;
  double samples_per_s = 0;      // batch / median step
  double max_samples_per_s = 0, min_samples_per_s = 0;  // spread over the timed steps
  int64_t peak_rss_bytes = 0;    // resident-memory high-water mark during this measure
  double bubble = -1;            // pipeline only: idle share of stage time in the median step
};

// The pipeline's step against the simulator (pipeline only).
struct BenchPrediction {
  double measured_step_s = 0;   // median executor wall time (from the step trace)
  double simulated_step_s = 0;  // median simulate() makespan of each step's own measured op costs
  double profiled_step_s = 0;   // simulate() on per-layer profiled costs, as `pipetrain plan` predicts
  double simulated_bubble = 0;  // the simulator's bubble for the median step's measured op costs
  std::vector<int> peak_in_flight;  // measured, per stage
  // Largest total of live tensor bytes allocated during one extra, untimed step (a counting
  // allocator: activations, gradients, optimizer temporaries; not the parameters).
  int64_t pipeline_peak_tensor_bytes = 0, baseline_peak_tensor_bytes = 0;
  // Data parallelism, medians over the timed steps: the longest stage's reduction (from its
  // Reduce action to its completion), and how much of it outlasted every stage's last action
  // (the rest was hidden behind compute); the optimizer state bytes copy 0 holds.
  double reduce_ms = 0, exposed_reduce_ms = 0;
  int64_t optimizer_state_bytes = 0;
  // Per device (copy 0's stages) at the peak of the counted step: the tensors its worker
  // allocated (activations, gradients, temporaries) plus its parameters and optimizer state;
  // and what `plan --auto` predicts for it (with a profile).
  std::vector<int64_t> device_peak_bytes;
  std::vector<double> predicted_device_peak_bytes;
  // The median timed step (by the executor's wall time) in parts, per stage (pipeline::breakdown:
  // they add up to its wall time); and that step as bench timed it around train_step, whose
  // excess over the wall time is what runs outside the executor (splitting the batch into
  // micro-batches, the loss's sum).
  std::vector<pipeline::StageBreakdown> breakdown;
  double breakdown_wall_s = 0, breakdown_timed_s = 0;
};

/// A breakdown as JSON: per stage, each part in milliseconds and the page faults.
nlohmann::json breakdown_json(const BenchPrediction& p);

struct BenchResult {
  BenchMeasure baseline;            // plain loop, one stage's intra-op threads
  BenchMeasure baseline_all_cores;  // plain loop, every core
  BenchMeasure pipeline;
  BenchPrediction prediction;
  partitioner::Balance balance;  // layers per virtual stage, as chosen by pipeline.balance
  bool deferred = false;         // weight gradients deferred (pipeline.defer_weight_grads)
  std::string deferral;          // "auto"'s decision and reason (planner::Deferral::text); empty when forced
};

inline constexpr int kMaxTimedSteps = 100000;

BenchResult run_bench(const job::Config& config, const BenchOptions& options);
void print_bench(std::ostream& out, const job::Config& config, const BenchResult& r);

// A sweep: run_bench for every combination of stage count, data-parallel copies, micro-batch
// count, recomputation mode, schedule and precision (the precisions of one combination back to back, each compared
// with the first), applied as overrides on top of `overrides` to the config file.
// Combinations the config cannot run (too few layers or samples, an interleaved schedule
// whose micro-batch count is not a multiple of the stages) are reported as skipped. One line
// of progress per combination on `progress`; one JSON object per combination on `json_lines`
// (if not null), each with the machine, the library versions, the thread settings and the
// config. A list balance whose length does not match a stage count is replaced by `uniform`.
struct SweepOptions {
  std::vector<int> stages, micro_batches;
  std::vector<int> data_parallel;       // pipeline.data_parallel values; empty: the config's
  std::vector<std::string> recompute, schedules;
  std::vector<std::string> precisions;  // train.precision values; empty: the config's
  BenchOptions bench;
};
void run_sweep(const std::string& config_path, const std::vector<std::string>& overrides,
               const SweepOptions& options, std::ostream& progress, std::ostream* json_lines);

// Resident-memory high-water mark of this process (VmHWM), and its reset (Linux >= 4.0).
int64_t peak_rss_bytes();
void reset_peak_rss();

}  // namespace pipetrain::train
