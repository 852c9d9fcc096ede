// One prediction: what a candidate plan (a schedule, its stages, micro-batches, chunks, balance,
// recomputation, deferred weight gradients, data-parallel copies, the devices' speeds and links)
// will do on per-layer costs: its step, bubble, peak memory per device and reductions. `plan`,
// `plan --auto`, `simulate` and `bench` all predict through predict(), so they agree on every
// figure for the same candidate (tests/planner_agreement_test.cpp). No libtorch: a profile is
// only read here.
#pragma once

#include <vector>

#include "common/recompute.h"
#include "partitioner/partition.h"
#include "profiler/collectives.h"
#include "schedule/simulate.h"

namespace pipetrain::profiler {
struct Profile;  // profiler/profile.h: per-layer costs (times, bytes) of one micro-batch
}

namespace pipetrain::planner {

// Data parallelism as the planner models it: D copies, the optimizer state sharded or not, and
// the measured (or filed) speed of the reduction.
struct DataParallelPlan {
  int copies = 1;
  bool sharded = false;
  profiler::ReduceLink link;
  std::vector<double> link_speed;  // per device (stage): its copies' slowest link relative to `link`; empty: 1
};

// A candidate plan and the machine it runs on: everything a prediction needs besides the costs.
struct PlanPoint {
  schedule::Kind schedule = schedule::Kind::GPipe;
  int stages = 1, micro_batches = 1, chunks = 1;
  Recompute recompute = Recompute::Never;
  bool defer = false;                  // weight gradients deferred (costed on the whole batch's profile)
  partitioner::Balance balance;        // layers per virtual stage
  DataParallelPlan data_parallel;
  double straggler = 0;                // add_straggler_wait's share (copies > 1)
  std::vector<double> speeds;          // per device (stage); empty: all 1
  double latency_ms = 0, bytes_per_ms = 0;  // transfers between stages (0: free)
  std::vector<double> device_bytes_per_ms;  // per device; empty: all bytes_per_ms
  double state_factor = 3;             // bytes per parameter byte besides it (job::state_factor)
  std::vector<partitioner::TieCost> ties;  // tied parameters: exchanged at the optimizer step (add_ties)
  // Searched kinds (zb-auto): searched on the prediction's own costs under this activation limit
  // (0: twice 1F1B's peak) instead of on equal costs as a pipeline builds it (`simulate`'s what-if).
  bool search_on_costs = false;
  double search_memory_limit = 0;
};

// What a candidate will do.
struct Prediction {
  schedule::Schedule schedule;       // the action lists predicted
  schedule::Costs costs;             // the cost table they were simulated on
  schedule::Simulation simulation;
  double step_ms = 0, bubble = 0;
  std::vector<double> peak_bytes;    // per device: device_peak_bytes, the one memory model
  std::vector<double> reduce_ms;     // per virtual stage: its gradients' reduction (copies > 1; else empty)
  double exposed_reduce_ms = 0;      // how long the reductions outlast the lists (the largest device's)
  double max_peak_bytes() const;     // the fullest device's peak
};

// Predicts `point` on `profile` (one micro-batch's per-layer costs); `whole` (a copy's whole
// batch, for the flush) when the point defers weight gradients; `run`: the schedule a pipeline
// runs (null: the one it would build for the point, schedule::pipeline_schedule).
Prediction predict(const PlanPoint& point, const profiler::Profile& profile, const profiler::Profile* whole = nullptr,
                   const schedule::Schedule* run = nullptr);

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

// Adds `pt.ties`' exchange at the optimizer step to the finishing work of the devices that hold
// their members (after add_straggler_wait): each member's gradient to the first member's device
// and the sum back, on the link between stages; sharded, the reductions of the stages holding a
// member moved there too (they run after the ties' sum), and with three copies or more the first
// member's value sent once more.
void add_ties(schedule::Costs& costs, const schedule::Schedule& s, const PlanPoint& pt);

// Per device of `s`: the bytes predicted at its peak: its parameters, those that train times
// state_factor (job::state_factor; LoRA's frozen weights hold no gradient or state), the activations `sim` held at their peak, when recomputing one
// rebuilt graph (its largest virtual stage's saved bytes), and its layers' largest workspace;
// deferring weight gradients, every micro-batch's stash of its layers as well (held to the end).
std::vector<double> device_peak_bytes(const profiler::Profile& p, const partitioner::Balance& balance,
                                      const schedule::Schedule& s, const schedule::Simulation& sim, Recompute recompute,
                                      double state_factor, bool deferred = false);

}  // namespace pipetrain::planner
