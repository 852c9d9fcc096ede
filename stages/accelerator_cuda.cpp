// The accelerator report of a CUDA build. It asks the CUDA runtime directly for the device
// count, which also says why there is none (no driver, no device), and libtorch's CUDA hooks
// for the versions it was built with.
#include <cuda_runtime_api.h>
// NVTX ships with the CUDA toolkit (header-only); a toolkit without it builds with no ranges.
#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define PIPETRAIN_HAVE_NVTX 1
#else
#define PIPETRAIN_HAVE_NVTX 0
#endif

#include <ATen/detail/CUDAHooksInterface.h>

#include "common/config.h"
#include "common/error.h"
#include "stages/accelerator.h"
#if PIPETRAIN_HAVE_NCCL
#include <nccl.h>
#endif

namespace pipetrain::stages {

namespace {
// CUDA encodes 13.0 as 13000; cuDNN 9.19.0 as 91900; NCCL 2.28.9 as 22809.
std::string cuda_version(long v) { return detail::concat(v / 1000, ".", (v % 1000) / 10); }
std::string cudnn_version(long v) { return detail::concat(v / 10000, ".", (v % 10000) / 100, ".", v % 100); }
}  // namespace

AcceleratorInfo accelerator_info() {
  AcceleratorInfo info;
  info.cuda = true;
  const auto& hooks = at::detail::getCUDAHooks();
  info.cuda_runtime = cuda_version(hooks.versionCUDART());
  if (hooks.hasCuDNN()) info.cudnn = cudnn_version(hooks.versionCuDNN());
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaSuccess) {
    info.gpus = count;
    if (count == 0) info.no_gpu_reason = "the CUDA runtime sees no device";
  } else {
    info.no_gpu_reason = cudaGetErrorString(err);
    (void)cudaGetLastError();  // the error is reported here; later CUDA calls start clean
  }
#if PIPETRAIN_HAVE_NCCL
  info.nccl = true;
  int v = 0;
  if (ncclGetVersion(&v) == ncclSuccess)
    info.nccl_version = detail::concat(v / 10000, ".", (v % 10000) / 100, ".", v % 100);
#endif
  return info;
}

#if PIPETRAIN_HAVE_NVTX
ProfilerRange::ProfilerRange(const std::string& name) { nvtxRangePushA(name.c_str()); }
ProfilerRange::~ProfilerRange() { nvtxRangePop(); }
#else
ProfilerRange::ProfilerRange(const std::string&) {}
ProfilerRange::~ProfilerRange() {}
#endif

}  // namespace pipetrain::stages
