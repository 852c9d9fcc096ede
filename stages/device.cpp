// The CPU and checking device contexts (device.h); the CUDA context is device_cuda.cpp, device
// names are device_names.cpp.
#include "stages/device.h"

#include <atomic>
#include <chrono>
#include <future>
#include <limits>
#include <mutex>
#include <optional>

#include <ATen/ATen.h>

#include "common/error.h"

namespace pipetrain::stages {

namespace {

class CpuContext : public DeviceContext {
 public:
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  std::unique_ptr<Scope> enter() override { return std::make_unique<Scope>(); }
  Marker mark() override { return {}; }
  void wait(const Marker& m) override {
    if (!m) return;
    host_reads_.fetch_add(1);
    m.impl->host_wait();  // a GPU's work: the CPU has no stream to queue the wait on
  }
  Received receive(const at::Tensor& t, const Marker& produced) override {
    wait(produced);
    return {t.device().is_cpu() ? t : t.to(c10::kCPU), {}};
  }
  void synchronize() override {}
};

std::atomic<int64_t> waits_seen{0}, skip_from{0}, skip_to{0};

// A copy the checking context owes: done when its marker is waited for, or at synchronize().
struct PendingCopy : MarkerImpl {
  at::Tensor src, dst;
  std::once_flag done;
  void perform() {
    std::call_once(done, [this] {
      // On a thread of its own, as a copy engine would run it, joined before the waiter goes on.
      std::async(std::launch::async, [this] { dst.copy_(src); }).get();
      src = at::Tensor();
    });
  }
  void host_wait() override { perform(); }
};

// The checking context's stamps: the steady clock when taken, read back through resolve() as a
// CUDA event's time is (a stamp's host_s is not used).
struct ClockStamp : StampImpl {
  std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now();
  double seconds_after(const StampImpl& origin) const override {
    return std::chrono::duration<double>(at - static_cast<const ClockStamp&>(origin).at).count();
  }
};

class CheckingContext : public DeviceContext {
 public:
  Stamp stamp(double host_s) override { return {host_s, std::make_shared<ClockStamp>()}; }
  bool times_device() const override { return true; }
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  std::unique_ptr<Scope> enter() override { return std::make_unique<Scope>(); }
  Marker mark() override { return {}; }  // CPU work is done when it returns
  void wait(const Marker& m) override {
    if (!m) return;
    const int64_t seen = waits_seen.fetch_add(1);
    if (seen >= skip_from.load() && seen < skip_to.load()) return;  // the deliberate fault: this wait is missing
    m.impl->host_wait();  // the copy runs now
  }
  Received receive(const at::Tensor& t, const Marker& produced) override {
    wait(produced);
    at::Tensor dst = at::empty_like(t, t.options().device(c10::kCPU));
    if (dst.is_floating_point() || dst.is_complex())
      dst.fill_(std::numeric_limits<double>::quiet_NaN());
    else  // every bit set: -1, the largest unsigned value, true
      dst.zero_().bitwise_not_();
    auto copy = std::make_shared<PendingCopy>();
    copy->src = t;
    copy->dst = dst;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back(copy);
    }
    return {dst, Marker{copy}};
  }
  void synchronize() override {
    host_reads_.fetch_add(1);
    std::vector<std::shared_ptr<PendingCopy>> pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending.swap(pending_);
    }
    for (auto& c : pending) c->perform();
  }

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<PendingCopy>> pending_;
};

}  // namespace

void checking_contexts_skip_waits(int n, int after) {
  skip_to.store(0);
  waits_seen.store(0);
  skip_from.store(after);
  skip_to.store(n > 0 ? static_cast<int64_t>(after) + n : 0);
}

std::unique_ptr<DeviceContext> make_device_context(const c10::Device& device, bool checking) {
  if (checking) {
    if (!device.is_cpu())
      throw ConfigError(detail::concat("the checking device context runs on the CPU only, not on ", device.str()));
    return std::make_unique<CheckingContext>();
  }
  if (device.is_cpu()) return std::make_unique<CpuContext>();
  if (device.is_cuda()) return detail_cuda::make_cuda_context(device);
  throw ConfigError(detail::concat("no device context for ", device.str(), "; stages run on cpu or cuda"));
}

}  // namespace pipetrain::stages
