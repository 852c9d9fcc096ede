#include "common/rng.h"

namespace pipetrain {

RngContext& current_rng_context() {
  thread_local RngContext ctx;
  return ctx;
}

namespace {
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t rng_key(uint64_t seed, int64_t step, uint64_t stream, int64_t sample) {
  uint64_t h = mix(seed);
  h = mix(h ^ static_cast<uint64_t>(step));
  h = mix(h ^ stream);
  h = mix(h ^ static_cast<uint64_t>(sample));
  return h;
}

}  // namespace pipetrain
