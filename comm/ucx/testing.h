// ucx: hooks for tests only; production code never includes this header. Defined in
// transport.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "comm/transport.h"

namespace pipetrain::comm {

// UCX's description of `transport`'s endpoint to `peer`: its lanes, each naming its transport
// and device ("sysv/memory", "tcp/lo"). `transport` must be a UCX one.
std::string ucx_endpoint_for_test(Transport& transport, int peer);

// Sends `bytes` to `dst` where the header of message `id` belongs, bypassing encode(), to check
// how a receiver treats a malformed header. `transport` must be a UCX one.
void send_raw_header_for_test(Transport& transport, int dst, const MessageId& id, const std::string& bytes);

// Bytes of GPU tensors this process's UCX transports copied to the host to send them: 0 where UCX
// carries device memory itself (PIPETRAIN_UCX_CUDA), every large payload's bytes otherwise.
uint64_t ucx_host_staged_bytes_for_test();

}  // namespace pipetrain::comm
