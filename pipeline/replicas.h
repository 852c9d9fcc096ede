// Data parallelism inside the engine: D replicas of the pipeline, each training on its own
// shard of every batch, with each virtual stage's gradients reduced across its D copies over a
// c10d process group (comm/process_group.h: Gloo on the CPU).
//
// The reduction of a virtual stage starts at the schedule's Reduce action, right after that
// stage's last backward part (schedule::with_reductions), and runs on the group's own thread
// beside the actions still to come; the optimizer waits for it. The gradients go in buckets
// (one flat tensor each) of at most `bucket_bytes`, summed: each replica's loss already weights
// its micro-batches by their share of the whole batch, so the sum is the gradient of the
// batch's mean loss, exactly as one device computes it.
//
// Sharded optimizer state (ZeRO stage 1): the stage's parameters are flattened (padded to a
// multiple of D) and replica d owns the d-th slice. The gradients are reduce-scattered (or
// all-reduced, each replica keeping its slice, where the backend's all-reduce is the faster:
// Gloo's), so each replica holds only the sum of its slice; its optimizer holds state for that
// slice alone and steps it; the updated slices are then all-gathered back into every replica's
// parameters.
//
// c10d's DDP Reducer is not used: it reduces at the end of every backward pass, where a
// pipeline step runs one backward per micro-batch and must reduce once, after the last.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/process_group.h"
#include "common/deadline.h"
#include "common/error.h"

namespace pipetrain::pipeline {

// A reduction that failed: a copy died, closed, aborted or did not answer in time.
class ReductionError : public TransportError {
 public:
  using TransportError::TransportError;
};

struct ReplicaInfo {
  int data_parallel = 1, copy = 0;
  std::string name;    // what the group does, for errors: "stage 1's gradient reduction"
  std::string others;  // who the other members are, for errors: "rank 3", "one of ranks 1, 3"
  int peer = -1;       // the other member's rank when there is only one (errors name it)
};

class GradientReducer {
 public:
  // `scatter` (sharded only): reduce-scatter the flat gradients; otherwise all-reduce them and
  // keep this replica's slice.
  GradientReducer(comm::ProcessGroup group, ReplicaInfo info, std::vector<at::Tensor> params, bool shard,
                  int64_t bucket_bytes, bool scatter = true);

  // Before a step's backward passes. Not accumulating: whatever an earlier reduction left is
  // dropped. Accumulating onto gradients a reduction already summed: they are held apart (the
  // parameters' .grad emptied) and added back when the next reduction finishes, so that they are
  // not summed over the replicas a second time; a sharded slice's reduced gradient stays, and the
  // next reduction adds to it.
  void begin_step(bool accumulate);
  // Starts reducing the gradients now in the parameters; they must not change before finish().
  // A parameter without a gradient (the same on every replica) is left out.
  void start();
  bool started() const { return !works_.empty(); }
  // Waits for the reduction and puts its result in place: each parameter's .grad holds the sum
  // over the replicas, or (sharded) shard().grad() holds the sum of this replica's slice.
  // Returns when the last of its operations completed (steady clock, seconds since epoch).
  double finish(Deadline deadline);

  bool sharded() const { return shard_; }
  // Sharded, with tied parameters (executor.h): the stage's reduction waits for the optimizer
  // step, where the ties' gradients are summed first (a tie's sum needs whole tensors, which the
  // reduction splits); the runner does not start it after the stage's last backward.
  void hold_for_ties() { for_ties_ = true; }
  bool held() const { return for_ties_; }
  // Sharded: the parameters (by index, true: left out) that grad_sq_norm leaves out, as a tie's
  // members after its first, whose weight counts once.
  void leave_out_of_norm(const std::vector<bool>& by_param);
  // Sharded: this replica's slice of the flattened parameters, the optimizer's one parameter.
  const at::Tensor& shard() const { return shard_param_; }
  // Sharded: the squared norm of the whole stage's reduced gradient (summed over the replicas),
  // without the parameters left out of it (leave_out_of_norm).
  double grad_sq_norm(Deadline deadline);
  // Sharded: after the optimizer stepped the slice, every replica's slice into the parameters.
  void gather_parameters(Deadline deadline);
  // Sharded: the slice of the parameters into shard() (after the parameters were loaded).
  void refresh_shard();
  // Sharded: full per-parameter tensors from every replica's slice of a per-element state tensor
  // of the shard's shape (e.g. Adam's exp_avg), and the reverse.
  std::vector<at::Tensor> gather_state(const at::Tensor& slice, Deadline deadline);
  at::Tensor slice_of(const std::vector<at::Tensor>& full) const;
  const std::vector<at::Tensor>& parameters() const { return params_; }

 private:
  [[noreturn]] void fail(const std::exception& e);
  void wait(const c10::intrusive_ptr<c10d::Work>& work, Deadline deadline);
  at::Tensor flat_parameters() const;

  comm::ProcessGroup group_;
  ReplicaInfo info_;
  std::vector<at::Tensor> params_;
  bool shard_;
  int64_t bucket_bytes_;
  bool scatter_;
  // Unsharded: buckets of parameter indices and their flat gradients in flight.
  std::vector<std::vector<size_t>> buckets_;
  std::vector<at::Tensor> flats_;
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::shared_ptr<std::atomic<double>> done_at_ = std::make_shared<std::atomic<double>>(0.0);
  // Unsharded: the parameters' .grad is a reduction's result; gradients held apart (begin_step).
  bool reduced_ = false;
  std::vector<at::Tensor> held_;
  // Sharded.
  int64_t numel_ = 0, padded_ = 0;
  at::Tensor shard_param_, shard_grad_;
  bool for_ties_ = false;
  // Sharded, some parameters left out of the norm: the (offset, length) of each run of this
  // replica's slice that counts; empty: all of it counts.
  std::vector<std::pair<int64_t, int64_t>> counted_;
};

}  // namespace pipetrain::pipeline
