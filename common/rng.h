// The pipeline's random streams. A random layer (dropout) draws its mask for sample i of a
// batch from a generator keyed by (seed, step, layer stream, global sample index), so the mask
// does not depend on how the batch is split into micro-batches, on the stage count, or on the
// order in which threads run. A stage saves the context at forward time and restores it when it
// recomputes, which makes recomputed masks identical to the original ones.
#pragma once

#include <cstdint>

namespace pipetrain {

struct RngContext {
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t sample_offset = 0;  // index of this micro-batch's first sample in the mini-batch
};

// The context of the calling thread (each stage thread sets its own).
RngContext& current_rng_context();

// Sets the calling thread's context for a scope and restores the previous one after it.
class RngContextGuard {
 public:
  explicit RngContextGuard(const RngContext& ctx) : saved_(current_rng_context()) {
    current_rng_context() = ctx;
  }
  ~RngContextGuard() { current_rng_context() = saved_; }
  RngContextGuard(const RngContextGuard&) = delete;
  RngContextGuard& operator=(const RngContextGuard&) = delete;

 private:
  RngContext saved_;
};

// A well-mixed 64-bit key for (seed, step, stream, sample): splitmix64 over the fields.
uint64_t rng_key(uint64_t seed, int64_t step, uint64_t stream, int64_t sample);

}  // namespace pipetrain
