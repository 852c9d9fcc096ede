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

// A pidfd on the process that `published` (a valid address, see above) names, or -1 when it is
// not another process of this host and pid namespace, no longer the same process, or the
// kernel refuses pidfds. The caller closes it.
int watch_process(const std::string& published);

// Whether `published` was written by this very process (ranks as threads): such a peer cannot
// die without this rank, and needs no watching.
bool is_this_process(const std::string& published);

// The process id in `published`'s record, for errors.
long process_id_of(const std::string& published);

}  // namespace pipetrain::comm::ucx
