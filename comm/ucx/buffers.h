// ucx: receive buffers of large messages (HugeBuffers).
//
// The data of a message lands where recv() allocates it, and the copy into it (cma, tcp) runs
// much faster into 2 MiB pages than into 4 KiB ones: a 4 MiB shared-memory transfer went from
// about 4.5 to about 7 GiB/s here (ucx_perftest allocates its buffers with huge pages too). So
// buffers of kHugeMin bytes and more are anonymous mappings advised for transparent huge pages,
// and freed ones are kept for reuse (up to kCacheBytes), which also spares the page faults of
// fresh memory.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

#include <ATen/core/Tensor.h>

#include "comm/wire.h"

namespace pipetrain::comm::ucx {

class HugeBuffers {
 public:
  static constexpr size_t kPage = size_t(2) << 20;
  static constexpr size_t kHugeMin = kPage;
  static constexpr size_t kCacheBytes = size_t(256) << 20;

  // The process's one cache; it outlives every tensor it handed out.
  static std::shared_ptr<HugeBuffers> instance();

  // An uninitialised tensor of the header's dtype and shape (h.nbytes >= kHugeMin).
  at::Tensor tensor(const WireHeader& h);

 private:
  HugeBuffers() = default;
  void* take(size_t bytes);
  void give(void* p, size_t bytes);

  std::mutex mu_;
  std::multimap<size_t, void*> free_;  // by size
  size_t cached_ = 0;
};

}  // namespace pipetrain::comm::ucx
