// c10d: "nccl-order", a point-to-point group with NCCL's ordering rules on the CPU, for tests.
//
// NCCL runs the point-to-point operations of two ranks on one stream per rank (c10d's
// ProcessGroupNCCL keys it "lo:hi", for both directions), in the order they were posted, and
// ignores tags; an operation blocks its stream until the peer's matching one runs. This group
// keeps exactly that: one FIFO per rank and pair, posted in the order the callers post; the two
// heads complete together when one is a send and the other the matching receive (same bytes);
// two sends or two receives at the heads can never progress, which NCCL would hang on: both
// operations, and every later one of the pair, fail at once with an error naming the pair and
// both heads. Made for the ranks of one process (threads), so that the transport above it
// (comm/c10d/transport.cpp) runs its real code under NCCL's rules on machines without a GPU.
#pragma once

#include <vector>

#include "comm/process_group.h"

namespace pipetrain::comm {

// `size` members of one in-process group; members[r] is rank r's. An operation's wait ends at its
// timeout (TimeoutError-like failure), at a deadlock of its pair, or when the work is aborted.
std::vector<ProcessGroup> make_nccl_order_group(int size);

}  // namespace pipetrain::comm
