// Dynamic loss scaling for float16 (precision fp16), as torch.amp.GradScaler does it: the loss
// is multiplied by a scale S before backward so that small gradients do not flush to zero in
// float16; the gradients are divided by S before the optimizer step. A step whose gradients hold
// an infinity or a NaN anywhere (on any stage, on any rank) is skipped on every stage and S is
// multiplied by `backoff`; after `growth_interval` steps in a row without one, S is multiplied by
// `growth`. Every rank feeds the same agreed verdicts in the same order, so every rank holds the
// same S.
#pragma once

#include <cstdint>
#include <vector>

namespace pipetrain::pipeline {

struct LossScaleOptions {
  double initial = 65536.0;  // 2^16, as GradScaler
  double growth = 2.0;
  double backoff = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 1.0 / (1 << 24);  // below this a run is diverging, not overflowing
  double max_scale = 16777216.0 * 16777216.0;  // 2^48: far beyond any useful scale, still finite
};

class LossScaler {
 public:
  explicit LossScaler(LossScaleOptions options = {});
  double scale() const { return scale_; }
  // Records an optimizer step's verdict: `overflow` (skipped) or not. Returns the new scale.
  double update(bool overflow);
  // The verdict from every stage's squared gradient norm (of the scaled gradients): records it
  // with update(); on an overflow returns false; otherwise divides the squares by S² in place,
  // sets `unscale` to 1/S (what the gradients are to be multiplied by) and returns true.
  bool unscale(std::vector<double>& squared_norms, double& unscale);
  int64_t good_steps() const { return good_; }  // steps since the last overflow or growth
  // Restores a saved state (checkpoints): ConfigError for a scale that is not finite and > 0.
  void restore(double scale, int64_t good_steps);

 private:
  LossScaleOptions options_;
  double scale_;
  int64_t good_ = 0;
};

}  // namespace pipetrain::pipeline
