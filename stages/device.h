// Where stages run, and the device context of each: the only code that touches streams, events,
// the caching allocator and a device's random state (architecture.md, "Devices through one door").
//
// A context belongs to one pipeline device (one stage thread, which runs every chunk of that
// device). Its thread enters it for every job (Worker does), so everything the stage issues —
// forward, backward, the optimizer — runs on the context's compute stream. What crosses to
// another stage's thread is marked (an event after the producing work) and the receiver makes
// its own stream wait for the mark before it uses the tensor; a tensor from another device or
// the host is brought over by receive(), whose result may be read only after wait() on the
// marker it returns. Three implementations:
//   cpu       no streams: every call is a no-op or a plain copy;
//   cuda      a compute stream per context, events for marks, record_stream so the caching
//             allocator knows which streams use a received tensor (compiled in every CUDA build);
//   checking  CPU, for tests: receive() returns a poisoned tensor (NaN, or the lowest integer)
//             and performs the copy only when its marker is waited for, on a copy thread of its
//             own, so a missing wait corrupts the result as a missing event wait would on a GPU;
//             its time stamps keep a clock of their own, read back as CUDA's events are.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "stages/accelerator.h"

namespace pipetrain::stages {

/// pipeline.devices decided: a device for every stage, and how it was decided.
struct StageDevices {
  std::vector<c10::Device> per_stage;  ///< one entry per stage, in stage order
  bool chosen = false;      ///< "auto" chose them (the names were empty or {"auto"})
  bool asked_auto = false;  ///< the names were {"auto"} itself, not left out
  std::string note;         ///< what "auto" chose, in one line ("pipeline.devices auto: the CPU (why)"); else ""
  bool any_cuda() const;    ///< whether some stage runs on a GPU
  bool any_cpu() const;     ///< whether some stage runs on the CPU
  /// Whether `note` is worth saying: always when "auto" was asked for, else when it chose GPUs.
  bool worth_noting() const { return chosen && (asked_auto || any_cuda()); }
};

/// pipeline.devices resolved for `stages` stages: the one place that decides where a job's
/// stages run. `names`: empty or {"auto"} (the GPUs when this process sees any, else the CPU),
/// {"cpu"}, one device name for every stage, or one per stage ("cuda:0", "cuda:1"; several stages
/// may share a device). On GPUs "auto" puts stage s on cuda:(s mod gpus), or, for a rank of a
/// multi-process job (`local_rank` >= 0, its place among its host's ranks), every stage on
/// cuda:(local_rank mod gpus). A device that does not exist or a kind this build cannot run is a
/// ConfigError naming `where` and the entry.
StageDevices resolve_devices(const std::vector<std::string>& names, int stages, const std::string& where,
                             int local_rank = -1);
/// The same against a given accelerator report instead of this process's (tests).
StageDevices resolve_devices(const std::vector<std::string>& names, int stages, const std::string& where,
                             int local_rank, const AcceleratorInfo& accelerator);

/// One device name ("cpu", "cuda", "cuda:1") checked as resolve_devices checks a list's entries.
c10::Device parse_device(const std::string& name, const std::string& where);

/// What a marker stands for (an event on CUDA, a pending copy on the checking context).
struct MarkerImpl {
  virtual ~MarkerImpl() = default;
  /// Blocks the host until the marked work is done (a context without streams, the CPU, waits so).
  virtual void host_wait() = 0;
};

/// A point in a context's work that another context can wait for: an event on CUDA, a pending
/// copy on the checking context, nothing on the CPU. Copyable; empty means "already done".
struct Marker {
  std::shared_ptr<MarkerImpl> impl;
  explicit operator bool() const { return static_cast<bool>(impl); }
};

/// What a time stamp stands for on a context that times its device's work (a timing event on
/// CUDA; the checking context's own clock).
struct StampImpl {
  virtual ~StampImpl() = default;
  /// Seconds from `origin`'s point to this one, on the device's clock, once both are done.
  virtual double seconds_after(const StampImpl& origin) const = 0;
};

/// A point in a context's work whose time is read after synchronize(): `host_s` is the host's
/// clock (on whatever scale the caller uses) when the stamp was taken; `impl`, where the context
/// times its device, the point on the device's clock.
struct Stamp {
  double host_s = 0;
  std::shared_ptr<StampImpl> impl;
};

/// A tensor brought onto a context's device, readable once `ready` has been waited for.
struct Received {
  at::Tensor tensor;
  Marker ready;
};

class DeviceContext {
 public:
  /// Held while the calling thread works in the context (device guard and compute stream).
  class Scope {
   public:
    virtual ~Scope() = default;
  };

  virtual ~DeviceContext() = default;
  virtual c10::Device device() const = 0;

  /// Makes the calling thread issue its work on this context's device and compute stream until
  /// the returned scope ends.
  virtual std::unique_ptr<Scope> enter() = 0;
  /// The point after the work issued so far on the compute stream (in the calling thread's scope).
  virtual Marker mark() = 0;
  /// Makes the work issued from now on in this context wait for `m` (never blocks the host on
  /// CUDA). An empty marker is already done.
  virtual void wait(const Marker& m) = 0;
  /// Brings `t`, produced up to `produced` by another context (or on the host), onto this
  /// context's device, from the calling thread inside this context's scope. The result's tensor
  /// may be read only after wait(result.ready).
  virtual Received receive(const at::Tensor& t, const Marker& produced) = 0;
  /// Blocks the host until the work issued in this context so far is done (once per step: never
  /// a device-wide synchronization).
  virtual void synchronize() = 0;
  /// The host's copy of `t` (a GPU's tensor read back, which waits for the work that produces
  /// it): the one door for reading a step's results on the host, counted by host_reads().
  virtual at::Tensor to_host(const at::Tensor& t) {
    host_reads_.fetch_add(1);
    return t.device().is_cpu() ? t : t.cpu();
  }
  /// How many times the host read or waited for work through this context so far: to_host();
  /// synchronize() on the contexts that keep work apart from the host (CUDA, checking); on the
  /// CPU context, whose own work is done when its calls return, a wait() for a GPU's marker.
  int64_t host_reads() const { return host_reads_.load(); }
  /// Bytes held at most by the device's allocator since the last reset (0 on the CPU, where
  /// common/memory_account.h counts them).
  virtual int64_t peak_bytes() const { return 0; }
  virtual void reset_peak() {}
  /// Bytes the device's allocator holds now (0 on the CPU, where common/memory_account.h and
  /// profiler::MemoryCounter count them).
  virtual int64_t allocated_bytes() const { return 0; }

  /// A time stamp after the work issued so far in the calling thread's scope: on CUDA a timing
  /// event on the compute stream (when the GPU got there, not when the host issued it); on the
  /// CPU the host's time `host_s` itself, the work being done when its call returned.
  virtual Stamp stamp(double host_s) { return {host_s, nullptr}; }
  /// Whether stamps time the device's work apart from the host's calls (CUDA, checking).
  virtual bool times_device() const { return false; }
  /// When `p`'s point was reached, on the host scale of `origin.host_s`: origin.host_s plus the
  /// device's time from `origin` to `p` (the origin taken with the stream idle, at a job's
  /// start, so its host and device times agree). Only after synchronize() has returned once both
  /// were taken. Without device times, p.host_s.
  static double resolve(const Stamp& origin, const Stamp& p) {
    return origin.impl && p.impl ? origin.host_s + p.impl->seconds_after(*origin.impl) : p.host_s;
  }

 protected:
  std::atomic<int64_t> host_reads_{0};  ///< host_reads()
};

/// The context for `device`: "cpu" (or a CPU device) -> the no-op one, a CUDA device -> the CUDA
/// one (ConfigError in a build without CUDA), `checking` -> the checking one (CPU devices only).
std::unique_ptr<DeviceContext> make_device_context(const c10::Device& device, bool checking = false);

/// The checking context's deliberate fault, for the test that shows the equivalence grid catches
/// a missing wait: counting the waits on any checking context from this call (0 first), waits
/// `after` to `after + n - 1` do nothing (their copies then run only at synchronize(), too late).
/// n = 0 restores normal waits.
void checking_contexts_skip_waits(int n, int after = 0);

namespace detail_cuda {
/// Implemented in device_cuda.cpp (a CUDA build) or device_none.cpp.
std::unique_ptr<DeviceContext> make_cuda_context(const c10::Device& device);
}  // namespace detail_cuda

}  // namespace pipetrain::stages
