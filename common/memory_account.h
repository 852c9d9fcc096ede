// memory_account: which device a thread's tensor allocations belong to. A pipeline's stage
// workers set it (pipeline/worker.h) so that a counting allocator (profiler::MemoryCounter) can
// keep a peak per device of an in-process pipeline, whose stages share one heap. -1: none.
#pragma once

namespace pipetrain {

inline int& memory_account() {
  thread_local int account = -1;
  return account;
}

}  // namespace pipetrain
