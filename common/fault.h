// The one seam for fault injection. Production code names the points where a test may inject a
// fault (fault_point("pipeline.step", device, step)); nothing happens there unless a hook was
// installed, and then the hook decides. The pipetrain binary installs one from the environment
// once at start (apps/faults.h), so that the tests of whole processes can kill or stop a rank at
// a chosen point; an embedding program never has one unless it installs it.
#pragma once

#include <cstdint>
#include <functional>

namespace pipetrain {

struct FaultPoint {
  const char* where;  // "pipeline.step": after a device's first action of a step;
                      // "checkpoint.shard": after a rank wrote a shard of a checkpoint
                      // "pipeline.reduce": after a device started reducing a stage's gradients
                      // across its copies (data parallelism)
  int rank;           // the device (pipeline.step), or the rank (checkpoint.shard; pipeline.reduce
                      // multi-process, where in-process it is the device)
  int64_t step;       // the pipeline step, or the checkpoint's training step
};

using FaultHook = std::function<void(const FaultPoint&)>;

// Installs `hook` (empty: none). Install before any pipeline runs: points are reached from the
// stages' threads, which read the hook without a lock.
void set_fault_hook(FaultHook hook);

// Calls the hook, if one is installed.
void fault_point(const char* where, int rank, int64_t step);

}  // namespace pipetrain
