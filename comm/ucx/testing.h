// ucx: hooks for tests only; production code never includes this header. Defined in
// transport.cpp, and ucx_log_for_test in log.cpp.
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

// Messages this process's UCX transports received ahead of their recv() (their header waiting in
// UCX's queue while an earlier message's data arrived from the same rank).
uint64_t ucx_read_ahead_for_test();

// Hands `message` to UCX's log dispatcher at UCX's level `ucs_level` (a ucs_log_level_t), as UCX's
// own ucs_warn() and ucs_error() do, after the first UCX transport of this process was made.
void ucx_log_for_test(int ucs_level, const std::string& message);

}  // namespace pipetrain::comm
