// Recomputation (activation checkpointing): which micro-batches a stage keeps only the input of
// and re-runs in backward (the config's pipeline.recompute, bench --recompute), and whether the
// calling thread is re-running a forward to rebuild a micro-batch's graph. A stage sets the latter
// for the duration of the recomputation; layers whose training forward has a side effect beyond
// its output (BatchNorm's statistics) skip that side effect while it is set, so every micro-batch
// counts once whatever the recomputation mode.
#pragma once

#include <string>
#include <vector>

namespace pipetrain {

// always: every micro-batch keeps only its input; except_last: all but the last one of the
// step (whose backward follows its forward at once in GPipe); never: every graph is kept.
enum class Recompute { Always, ExceptLast, Never };

// "always", "except_last", "never", in that order.
const std::vector<std::string>& recompute_modes();
const char* recompute_name(Recompute r);
// The mode of a name in recompute_modes(); ConfigError otherwise.
Recompute parse_recompute(const std::string& name);

// True inside a RecomputeGuard on this thread. The flag is defined once, in recompute.cpp, not
// as a thread_local of an inline function here, so that a layer of an embedding program built by
// another compiler than the library's reads the same flag (common/skip.h says why).
bool recomputing();
void set_recomputing(bool on);

class RecomputeGuard {
 public:
  RecomputeGuard() : saved_(recomputing()) { set_recomputing(true); }
  ~RecomputeGuard() { set_recomputing(saved_); }
  RecomputeGuard(const RecomputeGuard&) = delete;
  RecomputeGuard& operator=(const RecomputeGuard&) = delete;

 private:
  bool saved_;
};

}  // namespace pipetrain
