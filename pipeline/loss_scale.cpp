#include "pipeline/loss_scale.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace pipetrain::pipeline {

LossScaler::LossScaler(LossScaleOptions options) : options_(options), scale_(options.initial) {
  const auto& o = options_;
  if (!(o.initial > 0) || !std::isfinite(o.initial) || !(o.growth >= 1) || !std::isfinite(o.growth) ||
      !(o.backoff > 0 && o.backoff < 1) || o.growth_interval < 1 || !(o.min_scale > 0) || !(o.max_scale >= o.min_scale) ||
      !std::isfinite(o.max_scale))
    throw ConfigError(detail::concat("loss scaling: need initial > 0, growth >= 1, 0 < backoff < 1, growth_interval >= 1 "
                                     "and 0 < min_scale <= max_scale, got initial ", o.initial, ", growth ", o.growth,
                                     ", backoff ", o.backoff, ", growth_interval ", o.growth_interval));
}

double LossScaler::update(bool overflow) {
  if (overflow) {
    scale_ = std::max(options_.min_scale, scale_ * options_.backoff);
    good_ = 0;
  } else if (++good_ >= options_.growth_interval) {
    scale_ = std::min(options_.max_scale, scale_ * options_.growth);
    good_ = 0;
  }
  return scale_;
}

bool LossScaler::unscale(std::vector<double>& squared_norms, double& unscale) {
  const double S = scale_;
  const bool overflow =
      std::any_of(squared_norms.begin(), squared_norms.end(), [](double v) { return !std::isfinite(v); });
  update(overflow);
  if (overflow) return false;
  for (double& v : squared_norms) v /= S * S;
  unscale = 1.0 / S;
  return true;
}

void LossScaler::restore(double scale, int64_t good_steps) {
  if (!(scale > 0) || !std::isfinite(scale) || good_steps < 0)
    throw ConfigError(detail::concat("loss scaling: cannot restore scale ", scale, " after ", good_steps, " good steps"));
  scale_ = scale;
  good_ = good_steps;
}

}  // namespace pipetrain::pipeline
