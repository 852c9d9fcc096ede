// Internal to the pipeline module: the executor behind Pipeline (pipeline.h). It runs action
// lists (a training step's, or an evaluation's forward-only ones) on each local device's worker
// over the transport, and traces them (executor.cpp; boundary messages and short batches in
// messages.cpp; tied parameters in ties.cpp; the copies of data parallelism in
// data_parallel.cpp). The stage optimizers are apart from it (OptimizerSide here, optimizers.cpp:
// stepping, clipping, the loss scale, the sharded state); they share its workers.
#pragma once

#include <atomic>
#include <functional>
#include <chrono>
#include <map>
#include <tuple>
#include <unordered_set>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "models/weight_grads.h"
#include "pipeline/pipeline.h"
#include "pipeline/replicas.h"
#include "pipeline/worker.h"
#include "stages/autocast.h"
#include "stages/device.h"
#include "stages/stage.h"

namespace pipetrain::pipeline {

using schedule::Op;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
struct ClearAutocastCache {  // on the thread that ran the forwards (stages/autocast.h)
  ~ClearAutocastCache() { stages::clear_autocast_cache(); }
};

// Hands tensors between two virtual stages of one device (the turn of a V placement, or a
// device that holds consecutive chunks): no transfer, the sending action leaves it here and the
// receiving action takes it.
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

// What a list of actions is run for: a training step (forward with the loss, backward) or an
// evaluation (forward only, no gradients, the layers in evaluation mode).
enum class Pass { Train, Evaluate };

struct Executor {
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
  std::vector<std::unique_ptr<comm::Transport>> transports;
  // Each device's context (stages/device.h) for the devices run here (null elsewhere); each
  // worker enters its device's context for every job.
  std::vector<std::unique_ptr<stages::DeviceContext>> contexts;
  // In-process, a message between two devices carries the sender's mark, which the receiver's
  // context waits for: by (kind, micro-batch, channel, step tag, receiving device).
  std::mutex marks_mu;
  std::map<std::tuple<int, int, int, int64_t, int>, stages::Marker> marks;
  bool marking = false;  // some stage here runs on a GPU, whose work its marks follow
  void place_stages();  // the contexts, and the layers on their devices (executor.cpp)
  std::vector<std::unique_ptr<Worker>> workers;
  // Per device: its linear layers' weight gradients while deferred (options.defer_weight_grads),
  // used by that device's worker alone.
  std::vector<models::WeightGradStash> weight_grads;
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
  std::vector<std::unique_ptr<Executor>> others;
  std::vector<std::unique_ptr<Worker>> drivers;
  OptimizerSide opt;
  bool sync = true;             // reduce in the next forward-backward
  double world_loss = 0;        // multi-process: the last step's loss summed over every copy
  bool grads_reduced = true;    // the gradients held now are reduced (or need no reduction)
  bool sharded() const { return options.shard_optimizer && mesh.data_parallel > 1; }
  int peer(int device) const { return self < 0 ? device : mesh.rank(device, copy); }  // its rank
  void make_reducers();
  void make_replicas(const torch::nn::Sequential& model, const stages::LossFn& loss);
  void reduce_now();  // the gradients left unreduced, on every local device
  void merge_batch_norm();  // every BatchNorm's statistics of the step, merged over the copies
  std::string abort_notice(int r);  // a peer's abort reason that reached this rank's endpoint, if any
  // Runs `f` on every copy's Executor in-process (copy 0 here, the others on their drivers).
  void on_every_copy(const std::function<void(Executor&)>& f);
  void sync_copies();  // Pipeline::sync_copies
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
  // The same message received on this device's chunk `chunk_here`, from virtual stage `from_vs`,
  // through the device's context: its tensors may be read once the markers left in `ready` are
  // waited for.
  at::Tensor recv_across(int r, comm::Kind kind, int from_vs, int chunk_here, int boundary, int m, int64_t tag_step,
                         Skips* skips, LocalHandoff& local, std::vector<stages::Marker>& ready);

  // Takes `endpoint` (multi-process) only once it is checked; on a throw the caller still
  // holds it, or finds it in transports[self].
  void init(torch::nn::Sequential model, PipelineOptions options, stages::LossFn loss,
            std::unique_ptr<comm::Transport>& endpoint);
  bool is_local_device(int device) const { return self < 0 || device == self; }
  bool runs(int virtual_stage) const { return is_local_device(sched.device_of(virtual_stage)); }
  int last_device() const { return sched.device_of(static_cast<int>(stages.size()) - 1); }
  void check_usable() const;
  void agree_layout(int layers);  // multi-process: every rank takes rank 0's balance and checks its precision
  void exchange_step_results(int M);  // multi-process: every rank's losses, peaks and spans, after a step
  // With a transport that delivers in order (options.transport.in_order), `s` must hold under
  // it (schedule/in_order.h): a ConfigError otherwise.
  void check_delivery(const schedule::Schedule& s) const;
  void stop(const std::string& what);  // ends a multi-process pipeline, telling every peer
  [[noreturn]] void fail(const std::string& what, std::exception_ptr error);

  // Inputs of the step being run, shared read-only with the stage threads; an evaluation's
  // outputs (the last virtual stage's, per micro-batch).
  std::vector<at::Tensor> inputs, targets, outputs;
  std::vector<int64_t> offsets;
  std::vector<double> weights, losses;
  std::vector<at::Tensor> loss_values;  // the last stage's, on its device: read once, at the end of its list

  // Runs every local device's list of `lists` on its worker (a DeviceRunner each,
  // device_runner.h). A failing device aborts
  // its transport at once so that its peers stop waiting; returns the device whose error came
  // first (-1: none), every device's error in `errors`. `tag_step` tags the messages (negative
  // for evaluations, which never meet a training step's).
  int run_lists(const schedule::Schedule& lists, Pass pass, int64_t tag_step, Clock::time_point t0,
                std::vector<std::exception_ptr>& errors);
  double run_step(const at::Tensor& input, const at::Tensor& target, bool apply_optimizer,
                  bool accumulate = false, double scale = 1.0);
  at::Tensor evaluate(const at::Tensor& input);  // Pipeline::predict on this copy
  bool scaling() const { return options.precision == Precision::FP16; }
  Clock::time_point step_t0;  // start of the last run_step, for the optimizer's trace span
  bool accumulate_grads = false;  // read by the runners: keep the gradients already there
};


// The optimizer side's steps (optimizers.cpp), on an executor's workers.
// Clips the global gradient norm (every stage's gradients together), checks it, and steps every
// stage's optimizer, each in its own worker. Returns the norm before clipping (0 when nothing
// asked for it); infinity when an fp16 overflow skipped the step.
double step_all(Executor& e, Clock::time_point t0);
// Sharded optimizer: the whole state of virtual stage `vs`, gathered from every copy's slice.
std::unique_ptr<torch::optim::Optimizer> gather_optimizer(Executor& e, int vs);

}  // namespace pipetrain::pipeline
