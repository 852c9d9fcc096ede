#include "stages/autocast.h"

#include <ATen/autocast_mode.h>

namespace pipetrain::stages {

c10::ScalarType autocast_dtype(Precision p) {
  switch (p) {
    case Precision::FP32: return c10::kFloat;
    case Precision::BF16: return c10::kBFloat16;
    case Precision::FP16: return c10::kHalf;
  }
  return c10::kFloat;
}

AutocastGuard::AutocastGuard(Precision p, c10::DeviceType device) : active_(p != Precision::FP32), device_(device) {
  if (!active_) return;
  was_enabled_ = at::autocast::is_autocast_enabled(device_);
  was_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_dtype(device_, autocast_dtype(p));
  at::autocast::set_autocast_enabled(device_, true);
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  at::autocast::set_autocast_enabled(device_, was_enabled_);
  at::autocast::set_autocast_dtype(device_, was_dtype_);
}

void clear_autocast_cache() { at::autocast::clear_cache(); }

}  // namespace pipetrain::stages
