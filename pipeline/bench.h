// Side-by-side timing of the plain single-device loop and the pipeline on the same model,
// batch and data, in one process run.
#pragma once

#include <iosfwd>

#include "pipeline/trainer.h"

namespace pipetrain::pipeline {

struct BenchOptions {
  int warmup = 3;
  int repeat = 10;
};

struct BenchMeasure {
  std::string name;
  int threads = 0;               // intra-op threads (per stage for the pipeline)
  double median_step_s = 0;
  double min_step_s = 0, max_step_s = 0;
  double samples_per_s = 0;      // batch / median step
  int64_t peak_rss_bytes = 0;    // resident-memory high-water mark during this measure
  double bubble = -1;            // pipeline only: idle share of stage time in the median step
};

// The pipeline's step against the simulator (pipeline only).
struct BenchPrediction {
  double measured_step_s = 0;   // median executor wall time (from the step trace)
  double simulated_step_s = 0;  // median simulate() makespan of each step's own measured op costs
  double profiled_step_s = 0;   // simulate() on per-layer profiled costs, as `pipetrain plan` predicts
  std::vector<int> peak_in_flight;  // measured, per stage
  // Largest total of live tensor bytes allocated during one extra, untimed step (a counting
  // allocator: activations, gradients, optimizer temporaries; not the parameters).
  int64_t pipeline_peak_tensor_bytes = 0, baseline_peak_tensor_bytes = 0;
};

struct BenchResult {
  BenchMeasure baseline;            // plain loop, one stage's intra-op threads
  BenchMeasure baseline_all_cores;  // plain loop, every core
  BenchMeasure pipeline;
  BenchPrediction prediction;
  partitioner::Balance balance;  // layers per virtual stage, as chosen by pipeline.balance
};

BenchResult run_bench(const Config& config, const BenchOptions& options);
void print_bench(std::ostream& out, const Config& config, const BenchResult& r);

// Resident-memory high-water mark of this process (VmHWM), and its reset (Linux >= 4.0).
int64_t peak_rss_bytes();
void reset_peak_rss();

}  // namespace pipetrain::pipeline
