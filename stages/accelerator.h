// The accelerator side of this build: whether CUDA, cuDNN and NCCL are compiled in, their
// versions, and how many GPUs this process sees (and if none, why). A build without CUDA links
// accelerator_none.cpp, which reports that, so callers never test the build themselves.
#pragma once

#include <string>

namespace pipetrain::stages {

struct AcceleratorInfo {
  bool cuda = false;           // CUDA code compiled in (PIPETRAIN_WITH_CUDA)
  std::string cuda_runtime;    // "13.0" (the CUDA runtime libtorch was built with); empty without
  std::string cudnn;           // "9.19.0" (libtorch's cuDNN); empty when absent
  bool nccl = false;           // NCCL compiled in (PIPETRAIN_WITH_NCCL)
  std::string nccl_version;    // "2.28.9" (the NCCL library loaded); empty without
  int gpus = 0;                // CUDA devices this process sees
  std::string no_gpu_reason;   // why gpus is 0, e.g. "no CUDA-capable device is detected"
};

AcceleratorInfo accelerator_info();

}  // namespace pipetrain::stages
