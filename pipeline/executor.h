// Internal to the pipeline module: the executor of one data-parallel copy of a Pipeline
// (pipeline.h; the copies of this process side by side in copies.h). It builds the copy's stages
// and one runner per local device (device_runner.h: the device's context, worker, endpoint,
// stages and per-micro-batch buffers), runs a training step's or an evaluation's action lists on
// the runners, keeps the first failure and the step's results, and exchanges them between ranks
// (executor.cpp). Its parts, each with its own interface: the step the runners share (StepIO)
// and how they reach each other (Wiring), both in device_runner.h; tied parameters (Ties,
// ties.cpp); this copy's side of data parallelism (DataParallel, data_parallel.cpp); the stage
// optimizers (OptimizerSide, stepped in optimizers.cpp, on the runners' workers).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "pipeline/device_runner.h"
#include "pipeline/pipeline.h"
#include "pipeline/replicas.h"
#include "stages/stage.h"

namespace pipetrain::pipeline {

// Tied parameters (PipelineOptions::ties, ties.cpp). Each member of a tie keeps its own tensor
// on the stage that runs its layer; their gradients are summed once a step's lists are done.
class Ties {
 public:
  // Checks the ties against the model (whose layers `balance` cuts into virtual stages) and
  // makes every member equal to its tie's first.
  void init(const torch::nn::Sequential& model, const std::vector<models::Tie>& ties, const partitioner::Balance& balance);
  // A member after its tie's first, which the gradient norm leaves out (it counts once).
  bool follower(const at::Tensor& param) const { return followers_.count(param.unsafeGetTensorImpl()) > 0; }
  // Checkpoints' (follower, first member) names ("layer.parameter").
  const std::vector<std::pair<std::string, std::string>>& names() const { return names_; }
  bool empty() const { return groups_.empty(); }  // no ties
  // In one process: sums each tie's gradients in member order, on the first member's device, and
  // gives every member the sum on its own device.
  void sum_grads() const;
  // Across processes, this rank's part of the same sum (every rank calls it, on its runner's
  // worker inside `context`): each member's gradient goes over `endpoint` to the rank of its tie's
  // first member (`rank_of(virtual stage)`), which sums them in member order and sends the sum
  // to each other member's rank; only the members' ranks take part, in device memory where the
  // transport takes it. `step` tags the messages; each wait ends after `timeout_s`.
  void exchange_grads(comm::Transport& endpoint, stages::DeviceContext& context, const std::function<int(int)>& rank_of,
                      int64_t step, double timeout_s) const;
  // The virtual stages that hold a member of some tie.
  std::vector<int> virtual_stages() const;
  // Every member takes its tie's first member's value: in one process (copy_values), or across
  // processes as exchange_grads's sum travels (exchange_values). A sharded optimizer's reduction
  // sums a member's gradient in an order that depends on where the member sits in its stage's
  // flattened parameters; with three copies or more the sums may round apart, so after each
  // step the members are made equal again.
  void copy_values() const;
  void exchange_values(comm::Transport& endpoint, stages::DeviceContext& context, const std::function<int(int)>& rank_of,
                       int64_t step, double timeout_s) const;

 private:
  struct Member {
    int vs;  // the virtual stage that runs it (run by another rank: a released tensor here)
    at::Tensor param;
  };
  std::vector<std::vector<Member>> groups_;
  std::unordered_set<const c10::TensorImpl*> followers_;
  std::vector<std::pair<std::string, std::string>> names_;
};

// This copy's side of data parallelism (data_parallel.cpp, replicas.h): where it sits in the
// mesh, the c10d group of each local device's copies, each virtual stage's gradient reduction,
// and whether the gradients held now are reduced.
struct DataParallel {
  comm::Mesh mesh;  // stages x copies (comm/mesh.h)
  int copy = 0;     // this executor's copy
  std::vector<comm::ProcessGroup> device_groups;  // by device, for the devices run here
  std::vector<std::unique_ptr<GradientReducer>> reducers;  // by virtual stage; null: no parameters, or run elsewhere
  bool sync = true;         // reduce in the next forward-backward (read by the runners)
  bool reduced = true;      // the gradients held now are reduced (or need no reduction)
  bool ties_pending = false;  // the ties' sum and the reductions held for it (GradientReducer::hold_for_ties) still to run
  double world_loss = 0;    // multi-process: the last step's loss summed over every copy
};

// The optimizer side of one copy (optimizers.cpp): every virtual stage's optimizer and what
// happens between the last backward and the next forward.
struct OptimizerSide {
  OptimizerFactory factory;  // StageOptimizers::set's
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers;  // by virtual stage; null: none
  double grad_clip = 0, grad_norm = 0;
  bool track_norm = false, check_finite = false;
  LossScaler scaler;
  bool skipped = false;  // the last optimizer step, for a float16 overflow
};

class Executor {
 public:
  // Multi-process (`endpoint` set): takes the endpoint only once it is checked; on a throw the
  // caller still holds it, or finds it at endpoint(). `device_groups`: by device, the c10d group
  // of its copies (data parallelism); `copy`: this executor's copy in-process (across processes
  // the endpoint's rank says it).
  void init(torch::nn::Sequential model, PipelineOptions options, stages::LossFn loss,
            std::unique_ptr<comm::Transport>& endpoint, std::vector<comm::ProcessGroup> device_groups, int copy);

  // A training step on this copy's shard of the batch: its loss (multi-process with copies:
  // every copy's); the optimizers step after it when `apply_optimizer`.
  double run_step(const at::Tensor& input, const at::Tensor& target, bool apply_optimizer, bool accumulate,
                  double scale);
  at::Tensor evaluate(const at::Tensor& input);  // Pipeline::predict on this copy
  void check_usable() const;

  const PipelineOptions& options() const { return options_; }
  const comm::Mesh& mesh() const { return dp_.mesh; }
  int copy() const { return dp_.copy; }
  int rank() const { return self_ < 0 ? -1 : peer(self_); }  // multi-process: this rank; else -1
  comm::Transport* endpoint();  // multi-process: this rank's, once taken
  comm::Collectives& collectives() { return group_; }
  bool is_local_device(int device) const { return self_ < 0 || device == self_; }
  bool runs(int virtual_stage) const { return is_local_device(sched_.device_of(virtual_stage)); }
  const partitioner::Balance& balance() const { return balance_; }
  const schedule::Schedule& schedule() const { return sched_; }
  const StepTrace& trace() const { return trace_; }
  int64_t step() const { return io_.step; }
  void set_step(int64_t step) { io_.step = step; }
  void set_sync(bool on) { dp_.sync = on; }
  int fewest_micro_batches() const { return fewest_ ? fewest_ : configured_.micro_batches; }
  int64_t take_device_peak(int device);
  const std::vector<std::pair<std::string, std::string>>& tied_names() const { return ties_.names(); }
  torch::nn::Sequential& stage_layers(int virtual_stage) { return stages_.at(virtual_stage)->layers(); }

  // The optimizer side (optimizers.cpp), for StageOptimizers.
  bool sharded() const { return options_.shard_optimizer && dp_.mesh.data_parallel > 1; }
  bool scaling() const { return options_.precision == Precision::FP16; }
  OptimizerSide& optimizer_side() { return opt_; }
  GradientReducer* reducer(int virtual_stage) const { return dp_.reducers.at(virtual_stage).get(); }
  void set_optimizers(const OptimizerFactory& factory);
  double step_optimizers();  // after forward_backward: StageOptimizers::step on this copy
  // The gradients left unreduced, on every local device (data_parallel.cpp): first, with a
  // sharded optimizer, the ties' sum and the reductions held for it; then whatever a
  // forward_backward without sync_gradients left.
  void reduce_now();
  // Sharded optimizer: the whole state of virtual stage `vs`, gathered from every copy's slice.
  std::unique_ptr<torch::optim::Optimizer> gathered_optimizer(int vs);

  // Pipeline::sync_copies (data_parallel.cpp): the first copy refreshes its shards, every other
  // copies its parameters, buffers and optimizer state from it.
  void refresh_shards();
  void copy_from(const Executor& first);

 private:
  // Construction (executor.cpp).
  void check_options(const torch::nn::Sequential& model) const;
  void join_ranks(std::unique_ptr<comm::Transport>& endpoint, int layers);  // multi-process
  void make_stages(const torch::nn::Sequential& model, const stages::LossFn& loss);
  void make_runners();  // the contexts, the layers on their devices, a runner per local device
  std::vector<std::unique_ptr<stages::DeviceContext>> make_contexts();
  void agree_layout(int layers);  // multi-process: every rank takes rank 0's balance and checks its precision
  // With a transport that delivers in order (options.transport.in_order), `s` must hold under
  // it (schedule/in_order.h): a ConfigError otherwise.
  void check_delivery(const schedule::Schedule& s) const;
  at::Tensor pinned_for_gpus(const at::Tensor& t) const;  // a host batch pinned when GPU stages run here
  // The schedule for `m` micro-batches (m < the configured count: the kind's schedule for the
  // most micro-batches it supports up to m; the same placement and chunks) (messages.cpp).
  const schedule::Schedule& schedule_for(int m);

  // A step (executor.cpp).
  int split_batch(const at::Tensor& input, const at::Tensor& target, bool accumulate, double scale);
  // Runs every local device's list of `lists` on its runner's worker. A failing device aborts
  // its endpoint at once so that its peers stop waiting; returns the device whose error came
  // first (-1: none), every device's error in `errors`. `tag_step` tags the messages (negative
  // for evaluations, which never meet a training step's).
  int run_lists(const schedule::Schedule& lists, Pass pass, int64_t tag_step, Clock::time_point t0,
                std::vector<std::exception_ptr>& errors);
  void settle_batch_norm(bool failed);
  void exchange_step_results(int M);  // multi-process: every rank's losses, peaks and spans, after a step
  void fresh_endpoints();  // in-process, after a failure: fresh mailboxes
  std::exception_ptr on_local_devices(const std::function<void(DeviceRunner&)>& job,
                                      std::vector<std::exception_ptr>* errors = nullptr);
  void stop(const std::string& what);  // ends a multi-process pipeline, telling every peer
  [[noreturn]] void fail(const std::string& what, std::exception_ptr error);
  int peer(int device) const { return self_ < 0 ? device : dp_.mesh.rank(device, dp_.copy); }  // its rank
  int last_device() const { return sched_.device_of(static_cast<int>(stages_.size()) - 1); }

  // Data parallelism (data_parallel.cpp).
  void make_reducers();
  void sum_ties();  // every tie's gradients summed within this copy (Ties), on every local device
  void merge_batch_norm();  // every BatchNorm's statistics of the step, merged over the copies
  std::string abort_notice(int r);  // a peer's abort reason that reached this rank's endpoint, if any

  // The optimizer side (optimizers.cpp). Clips the global gradient norm (every stage's
  // gradients together), checks it, and steps every stage's optimizer, each device's in its
  // worker. Returns the norm before clipping (0 when nothing asked for it); infinity when an
  // fp16 overflow skipped the step.
  double step_all(Clock::time_point t0);
  void step_device_optimizers(int r, Clock::time_point t0, double grad_scale);
  double device_grad_sq_norm(int r) const;
  void share_tied_values();  // sharded with ties: see Ties::copy_values

  PipelineOptions options_;
  torch::nn::Sequential model_;
  partitioner::Balance balance_;
  schedule::Schedule sched_;  // this step's: the configured one, or one for fewer micro-batches
  schedule::Schedule configured_;
  std::map<int, schedule::Schedule> fewer_;  // by micro-batch count, made on first use
  int fewest_ = 0;  // the fewest micro-batches since the last optimizer step
  std::vector<std::unique_ptr<stages::Stage>> stages_;  // every virtual stage (another rank's released)
  std::vector<std::unique_ptr<DeviceRunner>> runners_;  // by device, for the devices run here
  Wiring wiring_;
  StepIO io_;
  Ties ties_;
  DataParallel dp_;
  OptimizerSide opt_;
  StepTrace trace_;
  Clock::time_point created_ = Clock::now();
  Clock::time_point step_t0_;  // start of the last run_step, for the optimizer's trace span
  int64_t predictions_ = 0;  // predict() calls, which tag their messages with negative steps
  std::atomic<int> first_failure_{-1};  // the device whose error caused a step to fail
  // Multi-process runtime: this process's device (-1 in-process), the devices it runs, and the
  // control plane among the ranks (a group of one in-process), which also records why the
  // pipeline can no longer be used.
  int self_ = -1;
  std::vector<int> local_;
  comm::Collectives group_;
  std::unique_ptr<comm::Transport> taken_;  // multi-process: this rank's endpoint, until its runner takes it
};

}  // namespace pipetrain::pipeline
