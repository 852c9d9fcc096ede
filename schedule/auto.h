// auto: schedules found by search against a cost table, after the zero-bubble paper's automatic
// scheduling. A greedy list scheduler plays the step forward in simulated time: each device, when
// free, runs a backward_input (B) whose gradient has arrived, else a forward whose input has
// arrived and whose activations fit under the memory limit, else a held-back backward_weight (W)
// to fill the wait. A few variants of those rules (which of B and F goes first when both are
// ready, whether W may delay an arrival, a tighter memory limit) and, for one chunk per device,
// the handcrafted ZB-H1 and ZB-H2 where they fit, are each simulated, and the shortest step wins.
//
// Memory is counted per device with Costs::saved_bytes (what a micro-batch holds on a virtual
// stage from its forward to its last backward part); without them each held micro-batch chunk
// counts 1, so a limit of 2K is twice 1F1B's peak on the first device. Nothing here depends on
// libtorch.
#pragma once

#include <cstddef>

#include "schedule/schedule.h"
#include "schedule/simulate.h"

namespace pipetrain::schedule {

// zb-auto: one chunk per device, built for `costs` under `memory_limit` per device. Throws
// ScheduleError naming the smallest limit that could work when nothing fits.
Schedule make_zb_auto(int stages, int micro_batches, const Costs& costs, double memory_limit);

// The default limit of zb-auto: twice the largest per-device peak of 1F1B with these costs (the
// zero-bubble paper's ZB-2p setting), counting every micro-batch's saved bytes as the search does
// (recomputed or not); 2K without saved_bytes.
double twice_1f1b_memory(int stages, int micro_batches, const Costs& costs);

// zb-v: the zero-bubble V schedule, two chunks per device in V placement, built by the same
// search for equal F, B and W under 1F1B's memory (2K half-size chunks on a device).
Schedule make_zb_v(int stages, int micro_batches);

// The same search for any placement and chunk count (both zb-auto and zb-v use it).
Schedule search_schedule(Kind kind, int stages, int micro_batches, int chunks, Placement placement,
                         const Costs& costs, double memory_limit);

// The exact optimum for tiny sizes (tests): every order of each device's F, B and W passes (one
// chunk per device), each simulated; the shortest step. Throws ScheduleError when the number of
// combinations exceeds `max_candidates`.
Schedule exhaustive_best(int stages, int micro_batches, const Costs& costs, size_t max_candidates = 1000000);

}  // namespace pipetrain::schedule
