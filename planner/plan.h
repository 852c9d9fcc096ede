// plan: what a config will do before it runs. The layers are profiled on this machine (or
// costs are loaded from a file), split by the configured balance method, and the configured
// schedule is simulated on those costs: per stage the layers, parameters, time, activation and
// predicted peak memory; for the step its predicted time and bubble; optionally every schedule
// side by side, and the configured schedule in each precision. `pipetrain plan` prints it.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "partitioner/partition.h"
#include "profiler/collectives.h"
#include "profiler/profile.h"
#include "job/balance.h"
#include "job/job.h"
#include "schedule/simulate.h"
#include "schedule/trace.h"

namespace pipetrain::planner {

using namespace ::pipetrain::job;  // the run layer below: configs and jobs

// The per-virtual-stage cost table of `balance` for simulate(): sums of the layers' costs, with
// the recomputation mode's extra forwards; for split backwards B and W, where the first stage
// (whose input needs no gradient) does all of its backward in W. With `deferred` (the profile of
// a copy's whole batch; null: not deferring), weight gradients are deferred as
// PipelineOptions::defer_weight_grads does: the layers whose stash holds bytes backward as
// profiled with it (W less what the stash takes), and each device's finishing work gains its
// layers' flush at the whole batch's rows.
schedule::Costs schedule_costs(const profiler::Profile& p, const partitioner::Balance& balance,
                               const schedule::Schedule& s, Recompute recompute,
                               const profiler::Profile* deferred = nullptr);

// Whether `p` measured a deferred backward for layer i whose stash holds bytes.
bool defers(const profiler::Profile& p, size_t i);

// Whether deferring weight gradients changes anything in `p` (a layer defers).
bool any_deferred(const profiler::Profile& p);

// A cost file's layers as a profile: B and W as the file gives them, else half the backward each.
profiler::Profile profile_of(std::vector<partitioner::LayerCost> layers);

// Divides each virtual stage's compute costs, and each device's tail (a flush), by the speed of
// its device (empty: all 1).
void apply_speeds(schedule::Costs& costs, const schedule::Schedule& s, const std::vector<double>& speeds);

// Data parallelism as the planner models it: D copies, the optimizer state sharded or not, and
// the measured (or filed) speed of the reduction.
struct DataParallelPlan {
  int copies = 1;
  bool sharded = false;
  profiler::ReduceLink link;
  std::vector<double> link_speed;  // per device (stage): its copies' slowest link relative to `link`; empty: 1
};

// Adds data parallelism's costs to `costs` of schedule `s` (with its Reduce actions): each
// virtual stage's Reduce is an all-reduce of its gradient bytes (its parameter bytes) on the
// link; sharded, the link's shard reduction (Gloo: the all-reduce; else a reduce-scatter), and
// the finishing work steps 1/D of the parameters and all-gathers them. Nothing for one copy.
void add_reductions(schedule::Costs& costs, const profiler::Profile& p, const partitioner::Balance& balance,
                    const schedule::Schedule& s, const DataParallelPlan& dp);

// The straggler wait at data parallelism's reductions (after add_reductions): copies that start
// a step together finish their compute at different times, and each reduction waits for the
// slowest. `share` (measured: planner/concurrency.h) of each device's compute in the step is
// added to its reductions (split evenly among its virtual stages).
void add_straggler_wait(schedule::Costs& costs, const schedule::Schedule& s, double share);

// Per device of `s`: the bytes predicted at its peak: its parameters times (1 + state_factor)
// (train::state_factor), the activations `sim` held at their peak, when recomputing one
// rebuilt graph (its largest virtual stage's saved bytes), and its layers' largest workspace;
// deferring weight gradients, every micro-batch's stash of its layers as well (held to the end).
std::vector<double> device_peak_bytes(const profiler::Profile& p, const partitioner::Balance& balance,
                                      const schedule::Schedule& s, const schedule::Simulation& sim, Recompute recompute,
                                      double state_factor, bool deferred = false);

// The reduction's link for D copies: the cost file's link when it gives a bandwidth (as ring
// collectives), else measured here (profiler::measure_reductions); free for one copy.
profiler::ReduceLink reduce_link(int copies, const partitioner::CostFile* file);

struct StageRow {
  int stage = 0, chunk = 0;
  std::string first_layer, last_layer;
  int64_t params = 0;          // parameter bytes
  double time_ms = 0;          // forward + backward of one micro-batch
  int64_t activation_bytes = 0;  // its output, one micro-batch
  int64_t peak_bytes = 0;      // predicted: parameters, state, activations held at the peak
  double share = 0;            // time_ms / bottleneck
  double reduce_ms = 0;        // data parallelism: its gradients' reduction across the copies
};

struct ScheduleRow {
  schedule::Kind kind = schedule::Kind::GPipe;
  int chunks = 1;
  double step_ms = 0, bubble = 0;
  std::vector<int> peak_in_flight;  // per device
  int64_t peak_bytes = 0;           // the largest predicted stage peak
  std::string error;                // why this schedule cannot run the config, if it cannot
};

// The configured schedule predicted in one precision (plan --compare): the layers profiled in it.
struct PrecisionRow {
  Precision precision = Precision::FP32;
  double step_ms = 0, bubble = 0;
  std::string error;  // why it could not be profiled or simulated, if so
};

struct PlanReport {
  std::string summary;  // model, data, stages, micro-batches, schedule, checkpoint, method
  profiler::Profile profile;
  partitioner::Balance balance;
  std::vector<StageRow> stages;
  ScheduleRow configured;
  std::vector<ScheduleRow> compared;  // with --compare: every schedule on the same balance
  // With --compare on profiled costs of a float32 model: the configured schedule in fp32 and in
  // bf16, each on its own profile and balance (the configured precision's is `configured`).
  std::vector<PrecisionRow> precisions;
  schedule::Simulation simulation;    // the configured schedule's
  DataParallelPlan data_parallel;     // the config's copies and the reduction's link
  // With pipeline.defer_weight_grads (and a layer that defers): the profile of a copy's whole
  // batch, whose flush each device runs at its end; else empty.
  profiler::Profile whole;
};

struct PlanOptions {
  bool compare = false;
  int repeat = 5;             // profiling runs per op (median)
  std::string costs_path;     // load these costs instead of profiling
};

PlanReport make_plan(const Config& c, const PlanOptions& options);

// A copy's whole batch profiled (its shard of the batch as one micro-batch), for the flush of
// deferred weight gradients (schedule_costs' `deferred`).
profiler::Profile whole_batch_profile(const Job& job, int repeat);

// The configured schedule's simulated step as a timeline (schedule/trace.h).
schedule::TraceTimeline simulated_timeline(const Config& c, const PlanReport& r);
void print_plan(std::ostream& out, const PlanReport& r);
void print_plan_json(std::ostream& out, const PlanReport& r);

}  // namespace pipetrain::planner
