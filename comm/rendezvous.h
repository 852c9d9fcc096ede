// comm: the ranks of a multi-process job find each other through libtorch's c10d::TCPStore,
// served by rank 0 at RankInfo::master_addr:master_port (launcher_env.h reads both from the
// environment). Every rank publishes its transport address and a hash of its configuration;
// each returns every rank's address once all hashes are known to be equal.
//
// Rank 0 binds the store's listening socket to master_addr alone (127.0.0.1 unless the
// launcher's environment says otherwise) and hands it to c10d's server; ranks connect there,
// within the deadline even when what listens never answers. A job has an identity
// (RankInfo::run_token): rank 0 records it in the store, a rank of another job is refused by
// name, and each rank claims its rank's slot atomically, so that a second claimant (two jobs on
// one port without tokens, a rank started twice) is refused, naming the first.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "comm/address_record.h"
#include "comm/launcher_env.h"
#include "comm/transport.h"
#include "common/deadline.h"

namespace pipetrain::comm {

/// Runs on every rank once the addresses are known and the configurations agree, while rank 0
/// still serves the store: for c10d groups that meet through it (process_group.h). Rank 0 keeps
/// serving until every rank's hook has returned (or the deadline passes).
using StoreHook = std::function<void(const c10::intrusive_ptr<c10d::Store>& store)>;

/// Blocks until every rank has published (or the deadline passes). Throws TimeoutError naming
/// the ranks that did not show up (peer(): the first of them), ConfigError naming the ranks
/// whose `config_hash` differs from rank 0's, TransportError when the store cannot be served.
/// `prefix` keeps the keys of separate rendezvous (e.g. after a restart) apart.
std::vector<std::string> rendezvous(const RankInfo& info, const std::string& address,
                                    const std::string& config_hash, Deadline deadline,
                                    const std::string& prefix = "pipetrain", const StoreHook& while_up = {});

/// rendezvous() as the address exchange of a transport factory (e.g. make_ucx_transport).
AddressExchange store_exchange(RankInfo info, std::string config_hash, Deadline deadline,
                               std::string prefix = "pipetrain", StoreHook while_up = {});

/// The devices by which this host reaches `host` (MASTER_ADDR), as UCX_NET_DEVICES names them:
/// the network interface that holds the local address of the route to it ("lo" for 127.0.0.1,
/// "eth0"), plus every RDMA port ("mlx5_0:1"), which UCX prefers where they exist. "" when the
/// interface cannot be told. A rank's UCX then listens for TCP connections on that interface
/// only, not on every interface of the host.
std::string ucx_devices_towards(const std::string& host);

/// The network interface that holds the local address of the route to `host` ("lo" for
/// 127.0.0.1, "eth0"); "" when it cannot be told.
std::string interface_towards(const std::string& host);

/// A TCP port on 127.0.0.1 that was free a moment ago (for a store that binds it right after).
int free_loopback_port();

/// A short hash of a configuration's text (64-bit FNV-1a, hex) to pass as `config_hash`.
std::string config_fingerprint(const std::string& text);

}  // namespace pipetrain::comm
