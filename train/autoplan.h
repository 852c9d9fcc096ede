// The auto-planner's search: every combination of stage count, micro-batch count, schedule (and
// chunks), recomputation mode, precision and balance method that the build runs, each predicted
// by the simulator on profiled per-layer costs (step, bubble, peak memory per device), the ones
// that do not fit the memory limit dropped, the rest ranked by predicted samples per second.
// The search itself takes the profiles from a callback, so it runs on measured profiles
// (`pipetrain plan --auto`) and on fixed cost tables (the tests) alike.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "common/precision.h"
#include "common/recompute.h"
#include "partitioner/partition.h"
#include "profiler/profile.h"
#include "train/config.h"

namespace pipetrain::train {

struct SearchSpace {
  int devices = 1;        // stage counts 1..devices (one data-parallel replica)
  int64_t batch = 1;      // samples per step
  int layers = 1;
  std::vector<int> micro_batches;          // each <= batch
  std::vector<std::string> schedules;      // schedule kinds
  std::vector<Recompute> recompute;
  std::vector<Precision> precisions;
  std::vector<std::string> balances;       // uniform, parameters, time
  std::vector<double> memory_limit;        // bytes per device (one entry: all alike); empty or 0: none
  std::vector<double> speeds;              // relative device speeds; empty: all 1
  // Gradient + optimizer bytes per parameter byte for a precision (e.g. Adam 3, + 0.5 for bf16).
  std::function<double(Precision)> state_factor = [](Precision) { return 3.0; };
};

struct Candidate {
  int stages = 1, micro_batches = 1, chunks = 1;
  std::string schedule, balance_method;
  Recompute recompute = Recompute::Never;
  Precision precision = Precision::FP32;
  partitioner::Balance balance;
  double step_ms = 0, bubble = 0, samples_per_s = 0;
  std::vector<double> peak_bytes;  // per device
  double max_peak_bytes() const;
};

struct SearchResult {
  std::vector<Candidate> fitting;  // fastest first
  size_t considered = 0;           // candidates simulated
  double smallest_peak = 0;        // the least per-device peak of any candidate (what a limit must allow)
  double seconds = 0;              // the search's own time, profiling excluded
};

// `profile(M, precision)` gives the per-layer costs of one micro-batch of batch/M samples (with
// B/W split and optimizer times). Throws ConfigError naming the smallest memory that would fit
// when no candidate fits the limit.
SearchResult search_plans(const SearchSpace& space,
                          const std::function<const profiler::Profile&(int, Precision)>& profile);

// `pipetrain plan CONFIG --auto`: the config's model and data, profiled for each micro-batch
// count and precision searched, over every schedule kind, recomputation mode and balance method
// the build has, on 1..devices stages.
struct AutoPlanOptions {
  int devices = 0;                     // 0: the config's pipeline.stages
  std::vector<double> memory_limit;    // bytes per device (one: all); empty: the config's, else none
  std::vector<double> speeds;          // empty: the config's pipeline.speeds
  int top = 5;
  int repeat = 3;                      // profiling runs per op
  std::string write_config;            // write the winner here (a config that runs as written)
};

struct AutoPlanReport {
  SearchResult result;
  Config chosen;                       // the winner as a config
  double profile_seconds = 0;
};

AutoPlanReport auto_plan(const Config& c, const AutoPlanOptions& options);
void print_auto_plan(std::ostream& out, const AutoPlanReport& r, int top);
// Every plan that fits, fastest first, one JSON object per line: stages, micro_batches, chunks,
// schedule, recompute, precision, balance_method, balance, step_ms, bubble, samples_per_s,
// peak_bytes (per device).
void print_auto_plan_json(std::ostream& out, const AutoPlanReport& r);

}  // namespace pipetrain::train
