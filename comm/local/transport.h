// local: the in-process backend. Ranks are threads of one process sharing a hub of mailboxes;
// a message is the encoded header plus the tensor itself (no copy). Code outside comm/ creates
// groups through make_transport_group() (comm/transport.h).
#pragma once

#include <memory>
#include <vector>

#include "comm/transport.h"

namespace pipetrain::comm {

// The endpoints of all ranks of one in-process group, one per rank.
std::vector<std::unique_ptr<Transport>> make_local_group(int world_size, TransportOptions options = {});

}  // namespace pipetrain::comm
