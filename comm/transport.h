// comm: moving activations and gradients between stages. A Transport is one rank's endpoint:
// send() returns without waiting for the receiver; recv() waits until the matching message
// arrives, its deadline passes (TimeoutError) or the transport is aborted (TransportError).
// Every message carries the validated wire header (comm/wire.h). Backends live in their own
// folder (local/, ucx/, c10d/) and are created through make_transport_group(); outside
// comm/ only the backends' own tests and benchmarks include a backend header (layout.rule).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/backend.h"
#include "comm/wire.h"
#include "common/deadline.h"

/// Moving tensors between stages and ranks: transports, rendezvous, launchers' variables, collectives.
namespace pipetrain::comm {

/// What a message is. Data messages (activations, gradients) go between the stages' threads or
/// ranks; control messages carry the control plane's collectives (collectives.h). comm/ gives
/// the numbers no meaning of its own: `chunk` is an opaque channel (the engine's model chunk, the
/// control plane's operation), `micro_batch` the message's place in it (the micro-batch, the
/// control plane's sequence number), and `step` is checked by the receiver against the header.
/// The tag is derived from kind, channel and place.
enum class Kind : uint8_t { Activation = 1, Grad = 2, Control = 3 };

/// Which message a send or a receive means.
struct MessageId {
  Kind kind;            ///< activation, gradient or control
  int micro_batch;      ///< its place: the micro-batch, or the control plane's sequence number
  int chunk = 0;        ///< its channel: the receiving chunk, or the control plane's operation
  int64_t step = 0;     ///< the training step, checked against the header
  /// What the message is, in the sender's words, for errors ("the step's losses"); a string with
  /// static storage, or null.
  const char* label = nullptr;

  /// kind, channel and place in 64 bits.
  uint64_t tag() const {
    return (static_cast<uint64_t>(kind) << 56) | (static_cast<uint64_t>(chunk & 0xffff) << 32) |
           static_cast<uint32_t>(micro_batch);
  }
  std::string describe() const;  ///< "activation of micro-batch 3 (step 7)", "the step's losses (control message 12)"
};

/// How a transport is made (make_transport_group, make_process_transport).
struct TransportOptions {
  uint64_t max_message_bytes = uint64_t(1) << 32;  ///< 4 GiB
  /// Which backend carries the messages (comm/backend.h has a row for each).
  Backend backend = Backend::Local;
  /// Operations on a peer that failed fail at once instead of at their deadline. UCX: endpoints
  /// in UCP_ERR_HANDLING_MODE_PEER, which UCX 1.13's shared-memory transports do not support,
  /// so ranks on one host then talk over tcp (and cma); turn it off for shared memory.
  bool detect_peer_failure = true;
  /// UCX: the network devices to use (and listen on), as UCX_NET_DEVICES takes them
  /// ("eth0,mlx5_0:1"); empty: UCX's own choice (every device). UCX_NET_DEVICES in the
  /// environment wins. A multi-process run passes ucx_devices_towards(MASTER_ADDR).
  std::string net_devices;
  /// local: deliver as NCCL does, each pair's messages in the order they were sent whatever the
  /// receiver asks for (a receive takes the pair's oldest message, and a message that is not the
  /// one asked for is an error naming both); for testing that schedules hold under it
  /// (schedule/in_order.h).
  bool in_order = false;
  /// gloo, nccl: the bound on joining the group (c10d's own timeout, which the transport's
  /// operations never use: a receive's bound is its deadline).
  double timeout_s = 300;
  /// nccl: the GPU this endpoint's activations and gradients live on (its own, one per process).
  c10::Device device = c10::Device(c10::kCPU);
  /// nccl, nccl-order: both directions of a pair on one point-to-point stream, as one NCCL
  /// communicator runs them. Off (the default), each direction has a group of its own; on, a
  /// schedule's sends and receives can cross and deadlock: for tests that show it.
  bool shared_p2p_stream = false;
  /// ucx: how many later messages from a peer a receive that waits for data may receive ahead
  /// of their recv() (their headers already arrived), so that their rendezvous overlaps; each
  /// holds its buffer from then on. 0 turns it off (a benchmark's comparison).
  int read_ahead = 2;
};

/// One rank's endpoint: tensors to and from the other ranks of its world.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;              ///< this endpoint's rank
  virtual int world_size() const = 0;        ///< the ranks of its world
  virtual std::string backend() const = 0;   ///< "local" or "ucx"

  /// Whether send() takes a tensor on `device` as it is. A transport that takes a GPU's tensors
  /// orders its transfer after the work the sending thread's current stream issued (or stages
  /// it through the host itself); for one that does not, the caller brings the tensor to the host.
  virtual bool takes(const c10::Device& device) const { return device.is_cpu(); }

  /// Sends `tensor` to rank `dst` as message `id`; returns once the tensor may be reused.
  virtual void send(int dst, const MessageId& id, const at::Tensor& tensor) = 0;
  /// The message `id` from rank `src`, validated; TimeoutError naming `src` at `deadline`,
  /// TransportError when the peer failed or the endpoint was aborted.
  virtual at::Tensor recv(int src, const MessageId& id, Deadline deadline) = 0;

  /// Wakes every waiting recv with an error that carries `reason`; later calls fail at once.
  virtual void abort(const std::string& reason) = 0;
};

/// Header for `tensor` (dtype, dims, bytes) sent as `id`.
WireHeader make_header(const at::Tensor& tensor, const MessageId& id);

/// Checks that a received header is the message that was asked for and describes `tensor`.
void check_received(const WireHeader& h, const MessageId& id, int self, int src);

/// Publishes this rank's transport address and returns every rank's address, indexed by rank.
/// Every rank of the world calls it once; it returns when all have published (rendezvous.h
/// makes one from a store, tests from memory).
using AddressExchange = std::function<std::vector<std::string>(const std::string& my_address)>;

/// A tensor with the dtype and shape of a validated header, for a backend to receive into.
at::Tensor empty_for(const WireHeader& h);
/// The libtorch dtype a wire dtype code stands for.
c10::ScalarType scalar_type_of(WireDType dtype);

/// The names of the backends compiled into this build, in the table's order (comm/backend.h).
std::vector<std::string> transport_backends();
/// The version of the library behind a compiled backend ("1.13.1" for ucx), "" where it has none.
std::string transport_backend_version(Backend backend);
/// Whether this build has the backend named `name` ("local", "ucx").
bool has_transport_backend(const std::string& name);

/// The endpoints of an in-process group (one per rank, ranks as threads of this process) of
/// `options.backend`. Throws ConfigError for a backend that is not compiled in or whose ranks
/// cannot be threads (backend.h: BackendInfo::threads).
std::vector<std::unique_ptr<Transport>> make_transport_group(const TransportOptions& options, int world_size);

/// This process's endpoint of a world whose ranks are processes (possibly on other hosts);
/// `exchange` publishes and collects the transport addresses (rendezvous.h: store_exchange).
/// Throws ConfigError for a backend that cannot connect processes ("local"), meets in the store
/// (the c10d ones: process_group.h) or is not compiled in.
std::unique_ptr<Transport> make_process_transport(const TransportOptions& options, int rank, int world_size,
                                                  const AddressExchange& exchange);

}  // namespace pipetrain::comm
