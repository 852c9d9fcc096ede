// A build without CUDA (device.h): no CUDA context, no GPUs.
#include "common/error.h"
#include "stages/device.h"

namespace pipetrain::stages::detail_cuda {

std::unique_ptr<DeviceContext> make_cuda_context(const c10::Device& device) {
  throw ConfigError("device " + device.str() + " needs CUDA, but this build has none (its libtorch has no CUDA)");
}

}  // namespace pipetrain::stages::detail_cuda
