// Internal to the pipeline module: the state behind Pipeline (pipeline.h), shared by the files
// that implement it (pipeline.cpp: construction and training steps; predict.cpp: evaluation and
// accessors).
#pragma once

#include <atomic>
#include <functional>
#include <chrono>
#include <map>
#include <tuple>
#include <unordered_set>
#include <memory>
#include <string>
#include <vector>

#include "pipeline/pipeline.h"
#include "pipeline/replicas.h"
#include "pipeline/worker.h"
#include "stages/autocast.h"
#include "stages/stage.h"

namespace pipetrain::pipeline {

using schedule::Op;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
struct ClearAutocastCache {  // on the thread that ran the forwards (stages/autocast.h)
  ~ClearAutocastCache() { stages::clear_autocast_cache(); }
};

struct LocalHandoff {
  std::map<std::tuple<int, int, int>, at::Tensor> held;  // (kind, micro-batch, chunk there)
  void put(comm::Kind kind, int m, int chunk, at::Tensor t) { held[{static_cast<int>(kind), m, chunk}] = std::move(t); }
  at::Tensor take(comm::Kind kind, int m, int chunk) {
    auto it = held.find({static_cast<int>(kind), m, chunk});
    if (it == held.end()) throw Error(detail::concat("pipeline: nothing handed over for micro-batch ", m, " chunk ", chunk));
    at::Tensor t = std::move(it->second);
    held.erase(it);
    return t;
  }
};

using Skips = stages::Skips;

struct Pipeline::Impl {
  PipelineOptions options;
  torch::nn::Sequential model;
  partitioner::Balance balance;
  schedule::Schedule sched;  // this step's: the configured one, or one for fewer micro-batches
  schedule::Schedule configured;
  std::map<int, schedule::Schedule> fewer;  // by micro-batch count, made on first use
  int fewest = 0;  // the fewest micro-batches since the last optimizer step
  // The schedule for `m` micro-batches (m < the configured count: the kind's schedule for the
  // most micro-batches it supports up to m; the same placement and chunks).
  const schedule::Schedule& schedule_for(int m);
  std::vector<std::unique_ptr<stages::Stage>> stages;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers;
  std::vector<std::unique_ptr<comm::Transport>> transports;
  std::vector<std::unique_ptr<Worker>> workers;
  StepTrace trace;
  Clock::time_point created = Clock::now();
  int64_t step = 0;
  int64_t predictions = 0;  // predict() calls, which tag their messages with negative steps
  std::atomic<int> first_failure{-1};  // the stage whose error caused a step to fail
  // Multi-process runtime: this process's device (-1 in-process), the devices it runs, and the
  // control plane among the ranks (a group of one in-process), which also records why the
  // pipeline can no longer be used.
  int self = -1;
  std::vector<int> local;
  comm::Collectives group;

  // Data parallelism: this pipeline is copy `copy` of mesh.data_parallel. device_groups[device]: the
  // c10d group of the device's copies (for the devices run here); reducers[virtual stage]: its
  // gradient reduction (null for a stage without parameters or run elsewhere). In-process, copy
  // 0 (the caller's) drives copies 1..D-1 (`others`), each from a driver thread of its own.
  comm::Mesh mesh;  // stages x copies (comm/mesh.h)
  int copy = 0;     // this pipeline's copy
  std::vector<comm::ProcessGroup> device_groups;
  std::vector<std::unique_ptr<GradientReducer>> reducers;
  std::vector<std::unique_ptr<Pipeline>> others;
  std::vector<std::unique_ptr<Worker>> drivers;
  OptimizerFactory factory;     // set_optimizer's
  bool sync = true;             // reduce in the next forward-backward
  double world_loss = 0;        // multi-process: the last step's loss summed over every copy
  bool grads_reduced = true;    // the gradients held now are reduced (or need no reduction)
  bool sharded() const { return options.shard_optimizer && mesh.data_parallel > 1; }
  int peer(int device) const { return self < 0 ? device : mesh.rank(device, copy); }  // its rank
  void make_reducers();
  void make_replicas(const torch::nn::Sequential& model, const stages::LossFn& loss);
  void reduce_now();  // the gradients left unreduced, on every local device
  void merge_batch_norm();
  std::string abort_notice(int r);  // a peer's abort reason that reached this rank's endpoint, if any
  std::unique_ptr<torch::optim::Optimizer> gather_optimizer(int vs);  // every BatchNorm's statistics of the step, merged over the copies
  // Runs `f` on every copy's Impl in-process (copy 0 here, the others on their drivers).
  void on_every_copy(const std::function<void(Impl&)>& f);
  double run(const at::Tensor& input, const at::Tensor& target, bool apply_optimizer, bool accumulate,
             double scale);

  // Tied parameters (PipelineOptions::ties, ties.cpp): each group's members, in order, with the
  // virtual stage that runs each (a member run by another rank holds a released tensor); the
  // members after the first, which the gradient norm leaves out; checkpoints' (follower, leader)
  // names ("layer.parameter").
  struct TiedParam {
    int vs;
    at::Tensor param;
  };
  std::vector<std::vector<TiedParam>> tie_groups;
  std::unordered_set<const c10::TensorImpl*> tie_followers;
  std::vector<std::pair<std::string, std::string>> tied_names;
  void init_ties(const torch::nn::Sequential& model);
  // Sums each group's gradients in member order and gives every member the sum (every rank takes
  // part, each the same exchanges). Before the norm and the optimizers.
  void sum_tied_grads();

  // Skip connections: the names crossing the cut after each virtual stage (models/skip.h).
  std::vector<std::vector<std::string>> crossing;
  void check_crossing() const;
  // Micro-batch m's message across the cut after virtual stage `boundary`, towards virtual stage
  // `to_vs` (kind Activation: forward; Grad: backward): the tensor, then the skips crossing
  // there in name order, each on a channel of its own (messages.cpp).
  void send_across(int r, comm::Kind kind, int to_vs, int boundary, int m, int64_t tag_step, const at::Tensor& t,
                   const Skips& skips, LocalHandoff& local);
  // The same message received on this device's chunk `chunk_here`, from virtual stage `from_vs`.
  at::Tensor recv_across(int r, comm::Kind kind, int from_vs, int chunk_here, int boundary, int m, int64_t tag_step,
                         Skips* skips, LocalHandoff& local);

  // Takes `endpoint` (multi-process) only once it is checked; on a throw the caller still
  // holds it, or finds it in transports[self].
  void init(torch::nn::Sequential model, PipelineOptions options, stages::LossFn loss,
            std::unique_ptr<comm::Transport>& endpoint);
  bool is_local_device(int device) const { return self < 0 || device == self; }
  bool runs(int virtual_stage) const { return is_local_device(sched.device_of(virtual_stage)); }
  int last_device() const { return sched.device_of(static_cast<int>(stages.size()) - 1); }
  void check_usable() const;
  void stop(const std::string& what);  // ends a multi-process pipeline, telling every peer
  [[noreturn]] void fail(const std::string& what, std::exception_ptr error);

  // Inputs of the step being run, shared read-only with the stage threads.
  std::vector<at::Tensor> inputs, targets;
  std::vector<int64_t> offsets;
  std::vector<double> weights, losses;

  void run_stage(int r, Clock::time_point t0);
  void step_optimizers(int r, Clock::time_point t0, double grad_scale);
  double stage_grad_sq_norm(int r) const;
  double step_all(Clock::time_point t0);
  double run_step(const at::Tensor& input, const at::Tensor& target, bool apply_optimizer,
                  bool accumulate = false, double scale = 1.0);
  double grad_clip = 0, grad_norm = 0;
  bool track_norm = false, check_finite = false;
  LossScaler scaler;
  bool skipped = false;  // the last optimizer step, for a float16 overflow
  bool scaling() const { return options.precision == Precision::FP16; }
  Clock::time_point step_t0;  // start of the last run_step, for the optimizer's trace span
  bool accumulate_grads = false;  // read by run_stage: keep the gradients already there
};


// Hands tensors between two virtual stages of one device (the turn of a V placement, or a
// device that holds consecutive chunks): no transfer, the sending action leaves it here and the
// receiving action takes it.

}  // namespace pipetrain::pipeline
