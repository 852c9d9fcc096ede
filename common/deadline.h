// A point in time after which a blocking call gives up.
#pragma once

#include <chrono>

namespace pipetrain {

using Clock = std::chrono::steady_clock;

struct Deadline {
  Clock::time_point at;

  static Deadline after(double seconds) {
    return {Clock::now() + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(seconds))};
  }
  bool passed() const { return Clock::now() >= at; }
};

}  // namespace pipetrain
