// pipeline.defer_weight_grads "auto" decided on the prediction (planner/deferral.h).
#include "planner/deferral.h"

#include <cmath>
#include <cstdio>

#include <torch/torch.h>

#include "common/strings.h"
#include "job/balance.h"
#include "planner/plan.h"
#include "planner/predict.h"

namespace pipetrain::planner {

using namespace ::pipetrain::job;  // the run layer below: configs and jobs

namespace {

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g MiB", bytes / (1 << 20));
  return buf;
}

std::string percent(double share) { return detail::concat(std::lround(100 * std::abs(share)), "%"); }

// The first device whose predicted peak is over its pipeline.memory_limit, as a reason; empty: all fit.
std::string over_limit(const Config& c, const Prediction& p) {
  const auto& limits = c.pipeline.memory_limit;
  for (size_t d = 0; d < p.peak_bytes.size() && d < limits.size(); ++d)
    if (limits[d] > 0 && p.peak_bytes[d] > static_cast<double>(limits[d]))
      return detail::concat("its predicted peak ", mib(p.peak_bytes[d]), " on device ", d,
                            " is over pipeline.memory_limit ", mib(static_cast<double>(limits[d])));
  return "";
}

}  // namespace

std::string Deferral::text() const { return detail::concat("auto: ", defer ? "deferred" : "not deferred", ", ", why); }

std::string deferral_words(bool deferred, const std::string& decision) {
  if (decision.empty()) return deferred ? ", deferred weight gradients" : "";
  const size_t comma = decision.find(", ");  // after "auto: [not ]deferred"
  const std::string why = comma == std::string::npos ? decision : "auto: " + decision.substr(comma + 2);
  return (deferred ? ", deferred weight gradients (" : ", weight gradients not deferred (") + why + ")";
}

std::string deferral_refused(const Job& job) {
  if (job.devices.any_cuda()) return "GPU stages (deferral works on CPU stages only)";
  if (job.options.precision != Precision::FP32)
    return detail::concat("precision ", precision_name(job.options.precision), " (libtorch's own linear runs under autocast)");
  if (job.options.micro_batches < 2) return "one micro-batch (no rows of several micro-batches to merge)";
  for (const auto& p : job.model.layers->parameters())
    if (p.dim() == 2 && static_cast<int64_t>(p.nbytes()) >= job.options.defer_min_bytes) return "";
  return detail::concat("no weight of ", mib(static_cast<double>(job.options.defer_min_bytes)), " or more");
}

Deferral decide_deferral(const Config& c, const partitioner::Balance& balance, const profiler::Profile& micro,
                         const profiler::Profile& whole) {
  // The reductions of data-parallel copies are left free: they cost the same either way, and
  // measuring their link is no cheap part of starting a run.
  const DataParallelPlan dp{c.pipeline.data_parallel, c.train.shard_optimizer && c.pipeline.data_parallel > 1, {}, {}};
  const Prediction plain = predict(config_point(c, balance, dp, false), micro);
  const Prediction deferred = predict(config_point(c, balance, dp, true), micro, &whole);
  Deferral d;
  d.plain_ms = plain.step_ms, d.deferred_ms = deferred.step_ms;
  const double gain = plain.step_ms > 0 ? 1 - deferred.step_ms / plain.step_ms : 0;
  char steps[96];
  std::snprintf(steps, sizeof steps, ", %.2f ms a step against %.2f", deferred.step_ms, plain.step_ms);
  const std::string speed =
      gain >= 0 ? detail::concat("predicted ", percent(gain), " faster", steps) : detail::concat("predicted ", percent(gain), " slower", steps);
  if (gain < kMinDeferralGain) {
    d.why = gain >= 0 ? detail::concat(speed, ", under the ", percent(kMinDeferralGain), " it must gain") : speed;
    return d;
  }
  const std::string full = over_limit(c, deferred);
  d.defer = full.empty();
  d.why = d.defer ? speed : detail::concat(speed, " but ", full);
  return d;
}

Deferral decide_deferral(const Job& job, const partitioner::Balance& balance, const profiler::Profile& micro,
                         int repeat, profiler::Profile* whole) {
  Deferral d;
  d.why = deferral_refused(job);
  if (d.why.empty() && !any_deferred(micro)) d.why = "no layer's backward was measured deferring (none of pipetrain's linear layers has a large weight)";
  if (!d.why.empty()) return d;
  profiler::Profile w = whole_batch_profile(job, repeat);
  d = decide_deferral(job.config, balance, micro, w);
  if (whole && d.defer) *whole = std::move(w);
  return d;
}

void resolve_deferral(Job& job) {
  if (job.config.pipeline.defer_weight_grads != DeferWeightGrads::Auto) return;
  Deferral d;
  d.why = deferral_refused(job);
  if (d.why.empty()) {
    const profiler::Profile micro = profile_job(job);
    if (job.options.balance.empty()) job.options.balance = choose_balance(job.config, job.model.layers, &micro);
    // The whole batch's profile is the price of deciding: its median of 2 runs (after the
    // profiler's warm-up) is enough for the flush and takes a third of the 5 a plan takes.
    d = decide_deferral(job, job.options.balance, micro, 2);
  }
  job.options.defer_weight_grads = d.defer;
  job.deferral = d.text();
}

}  // namespace pipetrain::planner
