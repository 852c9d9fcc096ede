// ucx: HugeBuffers (buffers.h), huge-page receive buffers kept for reuse.
#include "comm/ucx/buffers.h"

#include <sys/mman.h>

#include <cstdint>

#include <ATen/ATen.h>

#include "comm/transport.h"

namespace pipetrain::comm::ucx {

std::shared_ptr<HugeBuffers> HugeBuffers::instance() {
  static auto* cache = new std::shared_ptr<HugeBuffers>(new HugeBuffers);  // outlives every tensor
  return *cache;
}

at::Tensor HugeBuffers::tensor(const WireHeader& h) {
  const size_t bytes = (h.nbytes + kPage - 1) / kPage * kPage;
  void* p = take(bytes);
  if (!p) return empty_for(h);
  std::shared_ptr<HugeBuffers> self = instance();
  return at::from_blob(
      p, h.dims, [self, bytes](void* q) { self->give(q, bytes); },
      at::TensorOptions().dtype(scalar_type_of(h.dtype)));
}

void* HugeBuffers::take(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it != free_.end()) {
      void* p = it->second;
      free_.erase(it);
      cached_ -= bytes;
      return p;
    }
  }
  // Aligned to the huge page: map one page more and trim both ends.
  void* raw = ::mmap(nullptr, bytes + kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kPage - 1) / kPage * kPage;
  if (aligned > start) ::munmap(raw, aligned - start);
  if (const size_t tail = start + bytes + kPage - (aligned + bytes))
    ::munmap(reinterpret_cast<void*>(aligned + bytes), tail);
  ::madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);  // a hint; fine to fail
  return reinterpret_cast<void*>(aligned);
}

void HugeBuffers::give(void* p, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_ + bytes <= kCacheBytes) {
      free_.emplace(bytes, p);
      cached_ += bytes;
      return;
    }
  }
  ::munmap(p, bytes);
}

}  // namespace pipetrain::comm::ucx
