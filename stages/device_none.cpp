// A build without CUDA (device.h): no CUDA context, no GPUs.
#include "common/error.h"
#include "stages/device.h"

namespace pipetrain::stages::detail_cuda {

std::unique_ptr<DeviceContext> make_cuda_context(const c10::Device& device) {
  throw ConfigError("device " + device.str() + " needs CUDA, but this build has none (its libtorch has no CUDA)");
}

int cuda_devices(std::string* why_none) {
  if (why_none) *why_none = "this build has no CUDA";
  return 0;
}

}  // namespace pipetrain::stages::detail_cuda
