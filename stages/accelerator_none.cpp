// The accelerator report of a build without CUDA (PIPETRAIN_WITH_CUDA off).
#include "stages/accelerator.h"

namespace pipetrain::stages {

AcceleratorInfo accelerator_info() {
  AcceleratorInfo info;
  info.no_gpu_reason = "CUDA not compiled in (PIPETRAIN_WITH_CUDA=OFF or libtorch without CUDA)";
  return info;
}

ProfilerRange::ProfilerRange(const std::string&) {}
ProfilerRange::~ProfilerRange() = default;

}  // namespace pipetrain::stages
