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

// This member's endpoint over `control` (Gloo: headers, control messages, and, for "gloo", the
// data too) and `data` (NCCL, for "nccl"; null for "gloo"). Takes both groups over.
std::unique_ptr<Transport> make_c10d_transport(const TransportOptions& options, int rank, int world_size,
                                               ProcessGroup control, ProcessGroup data);

// The endpoints of an in-process "gloo" group: ranks as threads of this process, meeting in a
// HashStore and connected over the loopback interface.
std::vector<std::unique_ptr<Transport>> make_local_c10d_group(const TransportOptions& options, int world_size);

}  // namespace pipetrain::comm
