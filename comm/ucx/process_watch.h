// ucx: watching a peer process on the same host through a pidfd, so that a dead peer is noticed
// at once without UCX's peer-failure mode. UCX 1.13 keeps shared-memory transports (sysv, posix,
// cma) out of endpoints in that mode, for they cannot tell a dead peer; with it every message
// between two ranks on one host went through tcp over loopback. A rank's published address is
// its identity record (this file) followed by its UCX worker address. A peer whose record says
// it runs in another process on this host (same boot, same pid namespace) and whose process is
// still the one that wrote the record (same start time) is watched through a pidfd, which
// becomes readable when that process exits; its endpoint needs no peer-failure mode and may use
// shared memory. Any other peer (another host, another pid namespace, or pidfd_open refused) gets
// UCX's peer-failure mode as before. A peer in this very process (ranks as threads) needs neither.
#pragma once

#include <cstddef>
#include <string>

namespace pipetrain::comm::ucx {

// The record's size: a fixed-width line of text, so that any address shorter than this, or whose
// first bytes are not a record, is refused before UCX sees it.
constexpr size_t kIdentityBytes = 96;

// This process's identity record.
std::string identity_record();

// The UCX worker address that follows the record in `published`, which rank `rank` published;
// throws TransportError naming the rank when `published` does not start with a valid record.
std::string ucx_address_of(const std::string& published, int rank);

// Who published an address (a valid one, see above), as this rank can watch it.
struct PeerProcess {
  bool this_process = false;  // this very process (ranks as threads): it cannot die without us
  int pidfd = -1;             // another process of this host, watched; the caller closes it
  long pid = -1;              // its process id, for errors
};
// pidfd is -1 unless `published` names another process of this host and pid namespace that is
// still the one that wrote the record, and the kernel grants pidfds.
PeerProcess watch_peer(const std::string& published);

}  // namespace pipetrain::comm::ucx
