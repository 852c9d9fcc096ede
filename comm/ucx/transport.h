// ucx: the UCX backend (UCP tag API). Each rank owns a UCP context and worker and reaches every
// rank, itself included, through an endpoint made from that rank's worker address. A message
// is the 104-byte wire header, followed in the same UCP message by the data when it is small
// (up to 8 KiB), or by a second UCP message carrying the data straight from the tensor's memory
// into the received tensor's, which recv() allocates only once the header has been validated.
// The sender's rank is part of the UCP tag, so recv(src, id) only ever matches what src sent.
// abort() also tells every peer, so their waits end too.
//
// Code outside comm/ creates transports through make_transport_group(); a multi-process runtime
// calls make_ucx_transport() with its rendezvous as the address exchange (rendezvous.h:
// store_exchange). UCX's own environment (UCX_TLS, ...) picks the transports.
//
// The backend's files: transport.cpp (the protocol and the factories), internal.h (the class
// and which file holds which of its parts), tags.h (the tag layout), buffers.h (receive
// buffers), worker.cpp (the worker and its progress), liveness.cpp (liveness probes),
// teardown.cpp (abort and shutdown), testing.h (for tests only).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/transport.h"

namespace pipetrain::comm {

// One rank of a world of `world_size` ranks (processes or threads); `exchange` gets this rank's
// worker address (comm/transport.h).
std::unique_ptr<Transport> make_ucx_transport(int rank, int world_size, const AddressExchange& exchange,
                                              TransportOptions options = {});

// Every rank of an in-process group, each with its own context and worker; the addresses are
// exchanged in memory.
std::vector<std::unique_ptr<Transport>> make_ucx_group(int world_size, TransportOptions options = {});

// The version of the UCX library loaded ("1.13.1").
std::string ucx_version();

}  // namespace pipetrain::comm
