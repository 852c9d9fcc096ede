// libtorch's autocast for a precision (common/precision.h). Autocast state is per thread, so
// every thread that runs a stage's forward (each stage worker, its recomputation included) sets
// its own; backward runs outside it, in the dtypes the forward chose, as torch.autocast is meant
// to be used. Autocast keeps, per thread, a cache of the low-precision copies of the float32
// weights it made; a copy made before an optimizer step would be stale after it, so the cache is
// cleared at every step's start and end.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include "common/precision.h"

namespace pipetrain::stages {

// The dtype matrix products compute in: kFloat for FP32, else kBFloat16 or kHalf.
c10::ScalarType autocast_dtype(Precision p);

// Autocast for `device` in the precision's dtype for a scope on the calling thread, restoring the
// previous state after it. FP32 changes nothing.
class AutocastGuard {
 public:
  AutocastGuard(Precision p, c10::DeviceType device);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_;
  c10::DeviceType device_;
  bool was_enabled_ = false;
  c10::ScalarType was_dtype_ = c10::kFloat;
};

// Drops the calling thread's cached low-precision copies of weights.
void clear_autocast_cache();

// Every micro-batch's graph reaches a weight through the one backward node of autocast's cached
// copy (its cast), and that node was made by the step's first forward. The autograd engine runs
// the ready node made last first, so from the second micro-batch on each cast would run after
// all of the micro-batch's other nodes, holding every weight's low-precision gradient until the
// end of the backward (half the stage's float32 parameter bytes at once). This gives each node
// whose one edge leads to a parameter's gradient accumulator the accumulator's own priority, as
// the engine gives accumulators, so a weight's gradient is converted and accumulated as soon as
// its last user has run. Walks the graphs behind `roots`; values are unchanged.
void run_weight_casts_first(const std::vector<at::Tensor>& roots);

}  // namespace pipetrain::stages
