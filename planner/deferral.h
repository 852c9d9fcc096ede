// pipeline.defer_weight_grads "auto" (the default): whether a job defers its linear layers'
// weight gradients (PipelineOptions::defer_weight_grads), decided once before its pipeline is
// built, on the prediction plan and plan --auto cost deferral with (planner/predict.h):
// deferred where the job's profile predicts a faster step whose peak fits pipeline.memory_limit,
// not otherwise, and never where deferral cannot apply or no profile is to be had cheaply.
#pragma once

#include <string>

#include "job/job.h"
#include "partitioner/partition.h"
#include "profiler/profile.h"

namespace pipetrain::planner {

// What "auto" decided and why.
struct Deferral {
  bool defer = false;
  std::string why;                       // "predicted 12% faster", "GPU stages", ...
  double plain_ms = 0, deferred_ms = 0;  // the predicted steps (0: not predicted)
  // "auto: deferred, predicted 12% faster" / "auto: not deferred, ..."
  std::string text() const;
};

// How a run's summary line says it: deferred or not, and `decision` (Deferral::text; empty when
// the config forces it): ", deferred weight gradients (auto: predicted 12% faster, ...)",
// ", weight gradients not deferred (auto: ...)"; forced: ", deferred weight gradients" or nothing.
std::string deferral_words(bool deferred, const std::string& decision);

// The gain a deferred step must be predicted to reach: below it the choice is within what the
// prediction can tell apart, and deferring keeps every micro-batch's stash for nothing.
inline constexpr double kMinDeferralGain = 0.01;

// Why deferral is off for `job` before any profile: GPU stages (where it is refused), a
// precision other than float32 (libtorch's own linear runs), one micro-batch (nothing to merge),
// no two-dimensional weight of PipelineOptions::defer_min_bytes or more. Empty: the profile decides.
std::string deferral_refused(const job::Job& job);

// The decision on profiles of config `c` split as `balance`: `micro` one micro-batch's, `whole`
// a copy's whole batch's (the flush each device runs). Deferred where the predicted step is at
// least kMinDeferralGain shorter and every device's predicted peak fits pipeline.memory_limit.
Deferral decide_deferral(const job::Config& c, const partitioner::Balance& balance, const profiler::Profile& micro,
                         const profiler::Profile& whole);

// decide_deferral for `job` on its profile `micro` (measured with `repeat` runs per op): refused as
// deferral_refused says or where no layer of `micro` defers, else on the whole batch profiled
// here. When deferring and `whole` is given, the whole batch's profile is moved into it.
Deferral decide_deferral(const job::Job& job, const partitioner::Balance& balance, const profiler::Profile& micro,
                         int repeat, profiler::Profile* whole = nullptr);

// Decides pipeline.defer_weight_grads "auto" once for `job`: sets job.options.defer_weight_grads
// and job.deferral. Profiles the job's layers unless deferral_refused refuses first; an empty
// job.options.balance is resolved on that profile (so a balance by time profiles once). Does
// nothing where the config forces deferral on or off.
void resolve_deferral(job::Job& job);

}  // namespace pipetrain::planner
