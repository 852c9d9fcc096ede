// comm: libtorch's c10d process groups for the collectives of data parallelism: the gradients of
// a stage reduced across its replicas (all-reduce, or reduce-scatter and all-gather when the
// optimizer state is sharded). Gloo runs them on the CPU; NCCL on GPUs (comm/nccl/, with the
// CUDA runtime). The data plane between stages stays on comm::Transport.
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

#include "common/deadline.h"

namespace pipetrain::comm {

using ProcessGroup = c10::intrusive_ptr<c10d::Backend>;

// Whether this build can make Gloo groups (libtorch built with Gloo, as PyTorch's wheels are).
bool has_gloo();

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

// Waits for `work` until `deadline`: TimeoutError when it passes, TransportError with the
// backend's reason when the operation failed (a member died, closed or aborted); neither names
// a peer (-1), which the caller knows better.
void wait_work(const c10::intrusive_ptr<c10d::Work>& work, Deadline deadline);

}  // namespace pipetrain::comm
