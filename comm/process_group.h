// comm: libtorch's c10d process groups: the collectives of data parallelism (the gradients of a
// stage reduced across its replicas: all-reduce, or reduce-scatter and all-gather when the
// optimizer state is sharded), and the groups under the c10d transport (comm/c10d/), whose
// point-to-point messages carry activations and gradients. Gloo runs on the CPU, NCCL on GPUs.
//
// A group is c10d's Backend; its members meet through a c10d::Store: the run's TCPStore
// (multi-process, rendezvous.h) or an in-process HashStore (the threads runtime, where the
// replicas are threads of this process and still talk over loopback sockets).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "comm/transport.h"
#include "common/deadline.h"

namespace pipetrain::comm {

using ProcessGroup = c10::intrusive_ptr<c10d::Backend>;

// A Gloo group of `size` members, this one `rank`, meeting under `prefix` in `store`; its
// sockets bind to `interface` ("lo", "eth0"; "" resolves this host's name). Every operation's
// wait ends after `timeout_s`. Blocks until every member has joined; a member that does not
// join before the deadline is a TimeoutError.
ProcessGroup make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank,
                             int size, const std::string& interface, double timeout_s);

// In-process: `count` groups of `size` members each (members are threads of this process,
// connected over the loopback interface), all made at once. Returns groups[g][member].
std::vector<std::vector<ProcessGroup>> make_local_gloo_groups(int count, int size, double timeout_s);

// The collectives data parallelism uses, started on `group` (each returns at once; wait_work
// waits). They start one at a time in a process: c10d's flight recorder (on by default,
// TORCH_FR_BUFFER_SIZE) records every collective in process-wide state that it does not lock
// on its first sight of a group (FlightRecorder::recordWithResetEnabled in torch 2.11), so groups
// of one process (the threads runtime's copies) starting their first collectives together
// corrupted it.
c10::intrusive_ptr<c10d::Work> all_reduce(c10d::Backend& group, std::vector<at::Tensor>& tensors);  // sum, in place
c10::intrusive_ptr<c10d::Work> reduce_scatter(c10d::Backend& group, at::Tensor& out, at::Tensor& in);  // sum, member i's slice
c10::intrusive_ptr<c10d::Work> all_gather(c10d::Backend& group, at::Tensor& out, at::Tensor& in);  // every member's `in`, in order

// Point-to-point on `group` (started one at a time, as the collectives): `tensor` (contiguous)
// to or from member `peer` under `tag`; each returns at once, its Work waits.
c10::intrusive_ptr<c10d::Work> send(c10d::Backend& group, at::Tensor& tensor, int peer, int tag);
c10::intrusive_ptr<c10d::Work> recv(c10d::Backend& group, at::Tensor& tensor, int peer, int tag);

// NCCL's environment as this project runs it: a failed or timed-out operation aborts the
// communicator and raises in the waiting thread (TORCH_NCCL_ASYNC_ERROR_HANDLING=2, CleanUpOnly)
// instead of ending the process without a word (3, libtorch's default); a variable already set
// wins. setenv is not safe while other threads read the environment: call it before any thread
// starts (the pipetrain command does, first thing in main; make_nccl_group calls it again,
// which then changes nothing).
void prepare_nccl_environment();

// An NCCL group of `size` members (one GPU each, the calling thread's current device), meeting
// under `prefix` in `store`; its operations end after `timeout_s`, and a failed one aborts the
// communicator without ending the process (TORCH_NCCL_ASYNC_ERROR_HANDLING=2 unless set).
// ConfigError in a build without NCCL.
ProcessGroup make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank,
                             int size, double timeout_s);

// This member's endpoint of a c10d transport (options.backend "gloo" or "nccl", comm/c10d/):
// a Gloo group on `interface` for headers and control messages (and, for gloo, the data), and
// for nccl an NCCL group for the activations and gradients, both meeting under `prefix` in
// `store`. Every member calls it at once (a StoreHook of the rendezvous).
std::unique_ptr<Transport> make_group_transport(const TransportOptions& options,
                                                const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                                                int rank, int world_size, const std::string& interface);

// The first line of a c10d or Gloo error, printable, without libtorch's backtrace.
std::string error_reason(const std::exception& e);

// Waits for `work` until `deadline`: TimeoutError when it passes, TransportError with the
// backend's reason when the operation failed (a member died, closed or aborted); neither names
// a peer (-1), which the caller knows better.
void wait_work(const c10::intrusive_ptr<c10d::Work>& work, Deadline deadline);

}  // namespace pipetrain::comm
