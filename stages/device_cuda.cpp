// The CUDA device context (device.h): a compute stream and a communication stream per context,
// events for marks, the caching allocator told which streams use a received tensor, its peak for the stage's memory,
// timing events for the stamps.
// Compiled in every build whose libtorch has CUDA.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include "common/error.h"
#include "stages/device.h"

namespace pipetrain::stages {

namespace {

struct CudaMarker : MarkerImpl {
  at::cuda::CUDAEvent event;
  void host_wait() override { event.synchronize(); }
};

struct CudaStamp : StampImpl {
  at::cuda::CUDAEvent event{cudaEventDefault};  // timing enabled
  double seconds_after(const StampImpl& origin) const override {
    return static_cast<const CudaStamp&>(origin).event.elapsed_time(event) / 1000.0;
  }
};

class CudaScope : public DeviceContext::Scope {
 public:
  // The stage's stream first waits for what callers outside any context issued on the
  // device's default stream (a loaded checkpoint, a tied gradient summed by the caller).
  explicit CudaScope(const c10::cuda::CUDAStream& s) : guard_(s) {
    at::cuda::CUDAEvent issued;
    issued.record(c10::cuda::getDefaultCUDAStream(s.device_index()));
    issued.block(s);
  }

 private:
  c10::cuda::CUDAStreamGuard guard_;  // the device and its current stream, for this thread
};

class CudaContext : public DeviceContext {
 public:
  explicit CudaContext(const c10::Device& d)
      : device_(d),
        stream_(c10::cuda::getStreamFromPool(false, d.index())),
        comm_(c10::cuda::getStreamFromPool(false, d.index())) {}

  c10::Device device() const override { return device_; }
  std::unique_ptr<Scope> enter() override { return std::make_unique<CudaScope>(stream_); }

  Marker mark() override {
    auto m = std::make_shared<CudaMarker>();
    m->event.record(stream_);
    return Marker{m};
  }

  // Markers come from CUDA contexts (only they mark); a checking context's run on the CPU only.
  void wait(const Marker& m) override {
    if (m) static_cast<CudaMarker*>(m.impl.get())->event.block(stream_);
  }

  // Copies run on the context's communication stream, ordered to the producer by its mark and to
  // the consumer by the returned one, so that they overlap the compute stream's work; a tensor
  // already on this GPU is not copied, and its consumer waits for the producer's mark itself.
  Received receive(const at::Tensor& t, const Marker& produced) override {
    if (!t.is_cuda()) {
      // From the host. Pinned memory (the c10d transport's staging, the caching host allocator's,
      // which keeps it until the copy is done) copies without holding this thread; pageable
      // memory returns once the source was read.
      c10::cuda::CUDAStreamGuard guard(comm_);
      at::Tensor out = t.to(device_, /*non_blocking=*/t.is_pinned());
      out.record_stream(stream_);
      return {out, mark_on(comm_)};
    }
    if (t.device() == device_) {
      // Produced on another stream of this device: the allocator must not reuse its memory
      // before this stream's work on it is done.
      t.record_stream(stream_);
      return {t, produced};
    }
    // From another GPU: ATen copies on the source device's current stream of this thread after a
    // barrier with this device's current one (here the communication stream), which waits for the
    // copy after it; that source stream waits for the producer too, and keeps the source.
    const auto src_stream = c10::cuda::getCurrentCUDAStream(t.device().index());
    if (produced) static_cast<CudaMarker*>(produced.impl.get())->event.block(src_stream);
    c10::cuda::CUDAStreamGuard guard(comm_);
    at::Tensor out = t.to(device_);
    t.record_stream(src_stream);
    out.record_stream(stream_);
    return {out, mark_on(comm_)};
  }

  // The host waits for an event after each stream's work, not for the stream itself: the same
  // wait, which CUDA's sync-debug mode leaves alone, so that it flags only the synchronizations
  // that do not go through here (tests/gpu_test.cpp, Gpu.AStepIssuesNoHostSynchronization).
  void synchronize() override {
    host_reads_.fetch_add(1);
    at::cuda::CUDAEvent copies, compute;
    copies.record(comm_);
    compute.record(stream_);
    copies.synchronize();
    compute.synchronize();
  }

  // Into pinned memory without holding the stream, then the host waits for that copy's event.
  at::Tensor to_host(const at::Tensor& t) override {
    host_reads_.fetch_add(1);
    if (!t.is_cuda()) return t;
    at::Tensor out = at::empty(t.sizes(), t.options().device(c10::kCPU).pinned_memory(true));
    const auto current = c10::cuda::getCurrentCUDAStream(t.device().index());
    out.copy_(t, /*non_blocking=*/true);
    at::cuda::CUDAEvent copied;
    copied.record(current);
    copied.synchronize();
    return out;
  }

  int64_t peak_bytes() const override {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  }
  void reset_peak() override { c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index()); }
  int64_t allocated_bytes() const override {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
  }

  Stamp stamp(double host_s) override {
    auto s = std::make_shared<CudaStamp>();
    s->event.record(stream_);
    return {host_s, s};
  }
  bool times_device() const override { return true; }

 private:
  Marker mark_on(const c10::cuda::CUDAStream& s) {
    auto m = std::make_shared<CudaMarker>();
    m->event.record(s);
    return Marker{m};
  }

  c10::Device device_;
  c10::cuda::CUDAStream stream_;  // compute
  c10::cuda::CUDAStream comm_;    // copies into this device (receive)
};

}  // namespace

namespace detail_cuda {

std::unique_ptr<DeviceContext> make_cuda_context(const c10::Device& device) {
  return std::make_unique<CudaContext>(device);
}

}  // namespace detail_cuda

}  // namespace pipetrain::stages
