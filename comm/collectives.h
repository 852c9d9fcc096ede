// The control plane: collectives (all-gather, broadcast, barrier) among the ranks of a world,
// over any Transport, as gloo puts its algorithms over pairs. The engine uses it to agree on
// the stage layout, the step's losses and gradient norm; the run layer to gather checkpoint
// shards and to stop together; data parallelism will reduce over it.
//
// Every rank makes the same calls in the same order. Each call takes the next sequence number,
// which its messages carry (MessageId: channel = the operation, place = the sequence number),
// so a rank that is out of step waits for a message that never comes and fails at its
// deadline, rather than mixing up two exchanges. Every wait has the group's deadline. A failure
// (a peer that died, timed out or aborted) aborts the endpoint, which ends every peer's wait at
// once with an error naming this rank, and the group cannot be used again.
//
// A group of one (no endpoint: every device in this process) makes each call trivial.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/transport.h"

namespace pipetrain::comm {

/// The channel (MessageId::chunk) of each operation's control messages.
enum class Collective : int { AllGather = 1, Broadcast = 2, Barrier = 3 };

/// The message that operation `op` with sequence number `seq` sends; part of the wire protocol
/// (a peer that forges one is answered as any other malformed message).
MessageId collective_message(Collective op, int64_t seq, const char* what = nullptr);

/// The control plane among the ranks of a world (see the file's first comment).
class Collectives {
 public:
  /// A group of one: rank 0 of 1.
  Collectives() = default;
  /// The group of `endpoint`'s world; `endpoint` outlives this object. Each wait ends after
  /// `timeout_s` at most.
  Collectives(Transport& endpoint, double timeout_s);

  int rank() const { return t_ ? t_->rank() : 0; }               ///< this rank
  int world_size() const { return t_ ? t_->world_size() : 1; }  ///< the ranks in the group

  /// Every rank's `mine`, indexed by rank. `what` names the exchange in errors ("the step's
  /// losses"); a string with static storage.
  std::vector<at::Tensor> all_gather(const at::Tensor& mine, const char* what);
  /// all_gather() of a few numbers.
  std::vector<std::vector<double>> all_gather(const std::vector<double>& mine, const char* what);
  /// `root`'s `value` on every rank (the others' argument is ignored).
  at::Tensor broadcast(const at::Tensor& value, int root, const char* what);
  /// broadcast() of a few numbers.
  std::vector<double> broadcast(const std::vector<double>& values, int root, const char* what);
  /// True on every rank when `flag` is true on any.
  bool any(bool flag, const char* what);
  /// Returns when every rank has called it.
  void barrier(const char* what = "a barrier");

  /// Ends the group on every rank: peers waiting now or later fail at once with `reason`, naming
  /// this rank. The first reason is kept; a group of one only records it.
  void abort(const std::string& reason);
  /// Why the group can no longer be used (its first failure or abort); "" while it can.
  const std::string& failure() const { return failure_; }
  int64_t sequence() const { return seq_; }  ///< collectives run so far

 private:
  std::vector<at::Tensor> all_to_all(Collective op, const at::Tensor& mine, const char* what);
  void check_usable() const;
  [[noreturn]] void fail(const std::string& what);

  Transport* t_ = nullptr;
  double timeout_s_ = 0;
  int64_t seq_ = 0;
  std::string failure_;
};

}  // namespace pipetrain::comm
