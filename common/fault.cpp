#include "common/fault.h"

#include <atomic>

namespace pipetrain {

namespace {
// Hooks are few (one per process at most) and never freed, so a reader never sees a dangling one.
std::atomic<const FaultHook*> installed{nullptr};
}  // namespace

void set_fault_hook(FaultHook hook) {
  installed.store(hook ? new FaultHook(std::move(hook)) : nullptr, std::memory_order_release);
}

void fault_point(const char* where, int rank, int64_t step) {
  if (const FaultHook* hook = installed.load(std::memory_order_acquire)) (*hook)(FaultPoint{where, rank, step});
}

}  // namespace pipetrain
