// Delivery in order, as NCCL delivers: a communicator runs a pair's operations in the order they
// are posted and ignores tags, so the k-th message one device sends another is the k-th that
// the other receives from it, whatever it asked for. validate() proves a list set
// deadlock-free when a receive takes its own message whenever it was sent (tags match); a list
// set that also passes validate_in_order() runs the same under in-order delivery: its sends to
// each device come in the order that device receives them.
#pragma once

#include "schedule/schedule.h"

namespace pipetrain::schedule {

/// ScheduleError naming the pair, the position and both messages where a device's k-th receive
/// from a peer is not the k-th message that peer sends it (sends do not wait for their receive,
/// as the transports' send()).
void validate_in_order(const Schedule& s);

}  // namespace pipetrain::schedule
