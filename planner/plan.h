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
#include "planner/predict.h"
#include "schedule/trace.h"

namespace pipetrain::planner {


// The reduction's link for D copies: the cost file's link when it gives a bandwidth (as ring
// collectives), else measured here (profiler::measure_reductions); free for one copy.
profiler::ReduceLink reduce_link(int copies, const partitioner::CostFile* file);

// The model's ties (models::Model::ties) as the planner sees them: each tie's layers and the
// bytes of its first member.
std::vector<partitioner::TieCost> tie_costs(const models::Model& model);

// Config `c` on `balance` as a candidate: its schedule, sizes, recomputation, deferral, copies
// and speeds; transfers between stages free (plan adds a cost file's links).
PlanPoint config_point(const job::Config& c, const partitioner::Balance& balance, const DataParallelPlan& dp, bool defer);

struct StageRow {
  int stage = 0, chunk = 0;
  std::string first_layer, last_layer;
  int64_t params = 0;          // parameter bytes
  double time_ms = 0;          // forward + backward of one micro-batch
  int64_t activation_bytes = 0;  // its output, one micro-batch
  int64_t peak_bytes = 0;      // its device's predicted peak (Prediction::peak_bytes)
  double share = 0;            // time_ms / bottleneck
  double reduce_ms = 0;        // data parallelism: its gradients' reduction across the copies
};

struct ScheduleRow {
  schedule::Kind kind = schedule::Kind::GPipe;
  int chunks = 1;
  double step_ms = 0, bubble = 0;
  std::vector<int> peak_in_flight;  // per device
  int64_t peak_bytes = 0;           // the fullest device's predicted peak
  std::vector<double> device_peak_bytes;  // per device (Prediction::peak_bytes)
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
  PlanPoint point;                    // the configured candidate
  Prediction prediction;              // predict(point, profile, whole): what every figure above comes from
  DataParallelPlan data_parallel;     // the config's copies and the reduction's link
  // With pipeline.defer_weight_grads (and a layer that defers): the profile of a copy's whole
  // batch, whose flush each device runs at its end; else empty.
  profiler::Profile whole;
  // pipeline.defer_weight_grads "auto": the decision and its reason (Deferral::text); empty when forced.
  std::string deferral;
  // Under a reduced precision with frozen Linear weights in float32: what model.frozen_dtype would
  // save (models.md, "Frozen weights in bfloat16"); empty otherwise.
  std::string frozen_hint;
  // Where two or more stages share one GPU and there are more than 2 micro-batches: what the
  // micro-batches cost there (shared_device_hint); empty otherwise.
  std::string shared_device_hint;
};

struct PlanOptions {
  bool compare = false;
  int repeat = 5;             // profiling runs per op (median)
  std::string costs_path;     // load these costs instead of profiling
};

PlanReport make_plan(const job::Config& c, const PlanOptions& options);

// Stages that share one GPU overlap little on it, so micro-batches there cost their smaller
// products and a launch of every kernel and buy only activation memory: a line saying so, with
// what was measured (docs/gpu.md), where some GPU of `devices` holds two or more stages and
// `micro_batches` > 2; else "".
std::string shared_device_hint(const stages::StageDevices& devices, int micro_batches);

// A copy's whole batch profiled (its shard of the batch as one micro-batch), for the flush of
// deferred weight gradients (schedule_costs' `deferred`).
profiler::Profile whole_batch_profile(const job::Job& job, int repeat);

// The configured schedule's simulated step as a timeline (schedule/trace.h).
schedule::TraceTimeline simulated_timeline(const job::Config& c, const PlanReport& r);
void print_plan(std::ostream& out, const PlanReport& r);
void print_plan_json(std::ostream& out, const PlanReport& r);

}  // namespace pipetrain::planner
