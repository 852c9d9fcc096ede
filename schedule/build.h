// Internal to the schedule module: the pieces the schedule builders share.
#pragma once

#include <string>
#include <vector>

#include "schedule/schedule.h"

namespace pipetrain::schedule {

// A compute step of one device, before the communication around it is added.
struct Unit {
  Op op;
  int micro_batch, chunk;
};

// Turns each device's compute order into its action list: a receive right before the compute
// that needs it, a send right after the compute that produces it.
Schedule expand(Kind kind, int stages, int micro_batches, int chunks, Placement placement,
                const std::vector<std::vector<Unit>>& order);

}  // namespace pipetrain::schedule
