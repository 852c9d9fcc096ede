// The accelerator side of this build: whether CUDA, cuDNN and NCCL are compiled in, their
// versions, and how many GPUs this process sees (and if none, why). A build without CUDA links
// accelerator_none.cpp, which reports that, so callers never test the build themselves. And the
// CPU's side (cpu_info.cpp): whether it has the instructions that make bf16 products fast.
#pragma once

#include <string>

/// Stages: contiguous slices of layers on one device, and the devices themselves.
namespace pipetrain::stages {

/// What this build and process offer on the accelerator side (pipetrain --version prints it).
struct AcceleratorInfo {
  bool cuda = false;           ///< CUDA code compiled in (PIPETRAIN_WITH_CUDA)
  std::string cuda_runtime;    ///< "13.0" (the CUDA runtime libtorch was built with); empty without
  std::string cudnn;           ///< "9.19.0" (libtorch's cuDNN); empty when absent
  bool nccl = false;           ///< NCCL compiled in (PIPETRAIN_WITH_NCCL)
  std::string nccl_version;    ///< "2.28.9" (the NCCL library loaded); empty without
  int gpus = 0;                ///< CUDA devices this process sees
  std::string no_gpu_reason;   ///< why gpus is 0, e.g. "no CUDA-capable device is detected"
};

/// This build's and this process's.
AcceleratorInfo accelerator_info();

/// A named range on the profiler's timeline (NVTX, which nsys shows) from construction to
/// destruction, on the calling thread; nothing in a build without CUDA (or whose CUDA toolkit
/// has no NVTX headers), and next to nothing when no profiler listens.
class ProfilerRange {
 public:
  explicit ProfilerRange(const std::string& name);  ///< opens the range `name`
  ~ProfilerRange();  ///< closes it
  ProfilerRange(const ProfilerRange&) = delete;
  ProfilerRange& operator=(const ProfilerRange&) = delete;
};

/// What the CPU offers bf16 products, from the flags Linux lists in /proc/cpuinfo. Without
/// AVX-512 BF16 or AMX, libtorch's bf16 products convert in software: on an AMD EPYC with AVX2
/// only, train.precision bf16 ran 0.07x (MLP) and 0.21x (GPT) the float32 speed.
struct CpuInfo {
  std::string model;         ///< the first "model name", e.g. "AMD EPYC"; empty when not listed
  bool flags_known = false;  ///< a "flags" line was found
  bool avx512_bf16 = false;  ///< flag avx512_bf16 (AVX-512 BF16: vdpbf16ps)
  bool amx_bf16 = false;     ///< flag amx_bf16 (AMX tiles in bf16)
  bool fast_bf16() const { return avx512_bf16 || amx_bf16; }  ///< either of them
};

/// Reads the text of /proc/cpuinfo (its first "model name" and "flags" lines).
CpuInfo cpu_info_from(const std::string& cpuinfo);
/// This machine's. PIPETRAIN_CPU_FLAGS, when set, stands for the flags line (tests, and to see
/// what a CPU without them is told).
CpuInfo cpu_info();

/// The one-line warning for a CPU stage computing in bf16 on `cpu`, or "" where bf16 products
/// are fast there (or the flags are unknown). `measured`: bf16's speed relative to float32
/// measured on this machine (profiler::bf16_speed), 0 when not measured.
std::string slow_bf16_warning(const CpuInfo& cpu, double measured = 0);

}  // namespace pipetrain::stages
