// Whether the calling thread is re-running a forward to rebuild a checkpointed micro-batch's
// graph. A stage sets it for the duration of the recomputation; layers whose training forward
// has a side effect beyond its output (BatchNorm's statistics) skip that side effect while it is
// set, so every micro-batch counts once whatever the recomputation mode.
#pragma once

namespace pipetrain {

inline bool& recomputing_flag() {
  thread_local bool on = false;
  return on;
}

// True inside a RecomputeGuard on this thread.
inline bool recomputing() { return recomputing_flag(); }

class RecomputeGuard {
 public:
  RecomputeGuard() : saved_(recomputing_flag()) { recomputing_flag() = true; }
  ~RecomputeGuard() { recomputing_flag() = saved_; }
  RecomputeGuard(const RecomputeGuard&) = delete;
  RecomputeGuard& operator=(const RecomputeGuard&) = delete;

 private:
  bool saved_;
};

}  // namespace pipetrain
