// c10d: a Transport over libtorch's c10d process groups, the engine torch.distributed uses.
// "gloo" carries every message over a Gloo group (CPU tensors; what the CPU runs and tests);
// "nccl" carries activations and gradients over an NCCL group between GPUs, with the headers and
// the control plane's messages over the Gloo group. Outside comm/ only this backend's own tests
// include this header; everyone else makes transports through comm/transport.h and
// comm/process_group.h.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "comm/transport.h"

namespace pipetrain::comm {

// The groups activations and gradients travel on: `up` to a higher rank, `down` to a lower one
// (null: `up` carries both directions, TransportOptions::shared_p2p_stream). Both null for "gloo",
// whose data goes over the control group.
struct DataGroups {
  ProcessGroup up, down;
};

// This member's endpoint over `control` (Gloo: headers, control messages, and, for "gloo", the
// data too) and `data` (NCCL for "nccl", nccl_order.h's groups for "nccl-order"). Takes the groups over.
std::unique_ptr<Transport> make_c10d_transport(const TransportOptions& options, int rank, int world_size,
                                               ProcessGroup control, DataGroups data);

// The endpoints of an in-process "gloo" or "nccl-order" group: ranks as threads of this process,
// meeting in a HashStore and connected over the loopback interface.
std::vector<std::unique_ptr<Transport>> make_local_c10d_group(const TransportOptions& options, int world_size);

}  // namespace pipetrain::comm
