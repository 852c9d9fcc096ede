// The auto-planner's search: every combination of stage count, data-parallel copies (and
// whether their optimizer state is sharded), intra-op threads per stage (on a CPU, where the
// cores are shared out: all of them to one stage, the plain loop, or split among stages and
// copies), micro-batch count, schedule (and chunks),
// recomputation mode, precision and balance method that the build runs, each predicted
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
#include "profiler/collectives.h"
#include "profiler/profile.h"
#include "job/config.h"

namespace pipetrain::planner {


struct SearchSpace {
  int devices = 1;        // stages x copies <= devices
  // CPU plans: the cores the plan may use. Each of K stages x D copies gets T intra-op threads,
  // K x D x T <= cores, T = 1 or the most that fill the cores (cores / (K x D)); a stage's costs at
  // T threads come from its profile at 1 and at `cores` threads (Amdahl's law fitted per layer
  // between them), and K x D > 1 workers computing at once are slowed by `contention`. 0: no
  // such dimension (GPUs, a cost file's devices): T = 1, profiled alone.
  int cores = 0;
  // The slowdown of each of `busy` workers computing at once (>= 1; measured by
  // planner/concurrency.h), and the straggler wait at a data-parallel reduction among `copies`
  // as a share of a copy's compute in the step.
  std::function<double(int)> contention = [](int) { return 1.0; };
  std::function<double(int)> straggler = [](int) { return 0.0; };
  int max_data_parallel = 1;  // copies of the pipeline (each on batch / copies samples)
  int64_t batch = 1;      // samples per step
  int layers = 1;
  std::vector<int> micro_batches;          // each <= batch
  std::vector<schedule::Kind> schedules;   // schedule kinds
  std::vector<Recompute> recompute;
  // Deferred weight gradients (PipelineOptions::defer_weight_grads) off and, where a profile
  // measured a layer that defers, on: costed on the profile of a copy's whole batch for the flush.
  std::vector<bool> defer{false};
  std::vector<Precision> precisions;
  std::vector<job::BalanceMethod> balances;  // uniform, parameters, time
  std::vector<double> memory_limit;        // bytes per device (one entry: all alike); empty or 0: none
  // Share of each limit kept free for what the memory model does not count (allocator rounding,
  // small tensors of the executor): a plan fits when its predicted peak <= limit * (1 - headroom).
  double memory_headroom = 0;
  std::vector<double> speeds;              // relative device speeds; empty: all 1
  // Bytes per parameter byte besides the parameter for a precision, copies and sharding (as
  // job::state_factor: e.g. Adam 3, + 0.5 for bf16, + 1 for the reduction's buffer).
  std::function<double(Precision, int, bool)> state_factor = [](Precision, int, bool) { return 3.0; };
  // The reduction's link among D copies (planner::reduce_link); default free.
  std::function<profiler::ReduceLink(int)> link = [](int) { return profiler::ReduceLink{}; };
  // Transfers between stages: latency and bandwidth (0: free), and per device its own bandwidth
  // (empty: all bytes_per_ms), which also scales its reductions relative to `link`.
  double latency_ms = 0, bytes_per_ms = 0;
  std::vector<double> device_bytes_per_ms;
  std::vector<partitioner::TieCost> ties;  // the model's tied parameters (plan.h's tie_costs, or a cost file's)
};

struct Candidate {
  int stages = 1, micro_batches = 1, chunks = 1;
  int data_parallel = 1;
  bool sharded = false;  // the copies' optimizer state
  int threads = 1;       // intra-op threads per stage (CPU plans)
  schedule::Kind schedule = schedule::Kind::GPipe;
  job::BalanceMethod balance_method = job::BalanceMethod::Uniform;
  Recompute recompute = Recompute::Never;
  bool defer = false;  // weight gradients deferred to one GEMM per step
  Precision precision = Precision::FP32;
  partitioner::Balance balance;
  double step_ms = 0, bubble = 0, samples_per_s = 0;
  double exposed_reduce_ms = 0;    // how long the reductions outlast the schedule's lists
  std::vector<double> peak_bytes;  // per device (each copy's alike)
  double max_peak_bytes() const;
};

struct SearchResult {
  std::vector<Candidate> fitting;  // fastest first
  size_t considered = 0;           // candidates simulated
  double smallest_peak = 0;        // the least per-device peak of any candidate (what a limit must allow)
  double seconds = 0;              // the search's own time, profiling excluded
};

// `profile(rows, precision, threads)` gives the per-layer costs of one micro-batch of `rows`
// samples (with B/W split and optimizer times) at `threads` intra-op threads (1, or
// SearchSpace::cores); a plan of D copies and M micro-batches is costed on its largest
// micro-batch, ceil(ceil(batch / D) / M) samples. Throws ConfigError naming the smallest
// memory that would fit when no candidate fits the limit.
using ProfileSource = std::function<const profiler::Profile&(int64_t rows, Precision, int threads)>;
SearchResult search_plans(const SearchSpace& space, const ProfileSource& profile);

// `p1` (1 thread) and `pn` (n threads) on the same rows: each layer's times at `threads`, by
// Amdahl's law fitted to the two (a serial share s, 0 <= s <= 1: t(T) = t(1) (s + (1 - s) / T)).
profiler::Profile at_threads(const profiler::Profile& p1, const profiler::Profile& pn, int n, int threads);

// The plain loop's candidate in `r` (one stage, one copy, one micro-batch, every core), in
// `precision`; null if none fits.
const Candidate* plain_loop(const SearchResult& r, int cores, Precision precision);

// `pipetrain plan CONFIG --auto`: the config's model and data, profiled for each micro-batch
// size and precision searched, over every schedule kind, recomputation mode and balance method
// the build has, on 1..devices stages times 1..devices/stages data-parallel copies (sharded or
// not), the reduction's link measured here for each copy count. With a cost file: its layers
// scaled to each micro-batch size (it must give its micro_batch), its link for transfers and
// reductions (ring collectives), its devices' speeds and bandwidths, the config's precision
// only; the model is not built, so a config whose model does not fit this machine plans too.
struct AutoPlanOptions {
  std::string costs_path;              // plan on this cost file (partitioner/cost_file.h) instead of profiling
  int devices = 0;                     // 0: the cores (CPU), pipeline.stages x data_parallel (GPU), or the file's devices
  int cores = 0;                       // CPU plans: 0, this machine's
  std::vector<double> memory_limit;    // bytes per device (one: all); empty: the config's, else none
  double memory_headroom = 0.05;       // SearchSpace::memory_headroom
  std::vector<double> speeds;          // empty: the config's pipeline.speeds
  int top = 5;
  int repeat = 3;                      // profiling runs per op
  std::string write_config;            // write the winner here (a config that runs as written)
};

struct AutoPlanReport {
  SearchResult result;
  int cores = 0;                       // the cores planned for (0: not a CPU plan)
  std::vector<std::pair<int, double>> contention;  // (busy workers, slowdown) measured
  std::vector<std::pair<int, double>> straggler;   // (copies, straggler share) measured
  job::Config chosen;                       // the winner as a config
  double profile_seconds = 0;
};

AutoPlanReport auto_plan(const job::Config& c, const AutoPlanOptions& options);
void print_auto_plan(std::ostream& out, const AutoPlanReport& r, int top);
// Every plan that fits, fastest first, one JSON object per line: stages, data_parallel,
// shard_optimizer, threads, micro_batches, chunks, schedule, recompute, precision, balance_method,
// balance, step_ms, bubble, exposed_reduce_ms, samples_per_s, peak_bytes (per device).
void print_auto_plan_json(std::ostream& out, const AutoPlanReport& r);

}  // namespace pipetrain::planner
