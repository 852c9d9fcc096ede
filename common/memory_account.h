// memory_account: which device a thread's tensor allocations belong to. A pipeline's stage
// workers set it (pipeline/worker.h) so that a counting allocator (profiler::MemoryCounter) can
// keep a peak per device of an in-process pipeline, whose stages share one heap. -1: none.
// Defined once, in memory_account.cpp, so that every compiler's code sees one per thread
// (common/skip.h says why).
#pragma once

namespace pipetrain {

/// The calling thread's account (assignable).
int& memory_account();

}  // namespace pipetrain
