// Choosing the balance: the layers per virtual stage for the config's method (a list, uniform,
// parameters, or the exact min-max partition of profiled time or memory under the config's
// memory limits and device speeds), and the profile and memory model that the partition uses.
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include "partitioner/cost.h"
#include "partitioner/partition.h"
#include "profiler/profile.h"
#include "job/job.h"

namespace pipetrain::job {

// One micro-batch of the job's training data (of the first copy's shard with data
// parallelism), profiled layer by layer with the stage's thread count, with each layer's
// optimizer step. `rows` > 0: a micro-batch of that many samples instead.
profiler::Profile profile_job(const Job& job, int repeat = 5, int64_t rows = 0);

// Bytes a device holds through a step per parameter byte, besides the parameter: its gradient
// and the optimizer state (SGD 1, with momentum 2, Adam 3); bf16 and fp16 add autocast's weight
// copy. With D > 1 data-parallel copies, the reduction's flat copy of the gradients adds 1, and
// a sharded optimizer keeps 1/D of the state and of the parameters (its slice) per copy.
double state_factor(const OptimizerConfig& optimizer, Precision precision, int data_parallel = 1,
                    bool sharded = false);

// The memory model of the config: optimizer state per parameter byte, the schedule's peak
// in-flight micro-batches per virtual stage, the recomputation mode and the input size.
partitioner::MemoryModel memory_model(const Config& c, const profiler::Profile& p);

// The partitioner's constraints from the config: device speeds and memory limits (per virtual
// stage; a device's chunks share its memory), and with a profile the memory model.
partitioner::Constraints constraints(const Config& c, const profiler::Profile* profile);

// The one dispatch on a balance method: layers per virtual stage of `layers` (their costs; only
// parameter bytes for `parameters`) over `virtual_stages` under `k` (device speeds and memory
// limits; `memory` also reads k.memory): `list` gives `list` back (checked by the caller),
// `uniform` the most even counts, `parameters` balanced parameter bytes, `time` the exact
// min-max of forward + backward, `memory` the exact min-max of each layer's bytes at the peak.
partitioner::Balance balance_by(BalanceMethod method, const std::vector<partitioner::LayerCost>& layers,
                                int virtual_stages, partitioner::Constraints k, const partitioner::Balance& list = {});

// Layers per virtual stage for the config's balance method. `profile` is needed by `time` and
// `memory` (and for memory limits); the others ignore it. ConfigErrors name pipeline.balance.
partitioner::Balance choose_balance(const Config& c, const torch::nn::Sequential& model,
                                    const profiler::Profile* profile);

// The job's balance: the config's list, or choose_balance() (profiling the job's layers for
// `time` and `memory`).
partitioner::Balance resolve_balance(const Job& job);

// prepare() with the balance resolved: a job ready for a pipeline.
Job prepare_balanced(const Config& config);

}  // namespace pipetrain::job
