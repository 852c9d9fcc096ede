// The public C++ API. A Pipeline takes a torch::nn::Sequential, splits it into stages (the
// modules are shared, so the caller's model sees every update), and runs each step as a
// schedule of micro-batch forwards and backwards, one thread per stage, over a transport. Its
// executors (one per data-parallel copy) run the schedule's action lists; its stage optimizers
// (optimizers.h) step, clip and scale apart from them, on the same stage threads.
//
//   pipetrain::pipeline::PipelineOptions options;
//   options.stages = 2;
//   options.micro_batches = 8;
//   pipetrain::pipeline::Pipeline pipe(model, options, loss_fn);
//   pipe.optimizers().set([](auto params) { return std::make_unique<torch::optim::SGD>(params, 0.1); });
//   double loss = pipe.train_step(input, target);
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>

#include "comm/collectives.h"
#include "comm/mesh.h"
#include "comm/process_group.h"
#include "comm/transport.h"
#include "common/error.h"
#include "common/precision.h"
#include "models/model.h"
#include "models/skip.h"
#include "pipeline/loss_scale.h"
#include "pipeline/optimizers.h"
#include "partitioner/partition.h"
#include "pipeline/step_trace.h"
#include "schedule/schedule.h"
#include "stages/stage.h"

/// The pipeline an embedding program drives: stages, micro-batches, the step and its trace.
namespace pipetrain::pipeline {

/// What a Pipeline runs: the stages and their schedule, and how they talk and train.
struct PipelineOptions {
  int stages = 1;         ///< devices (each runs `chunks` virtual stages)
  int micro_batches = 1;  ///< micro-batches per batch (a short batch runs as fewer)
  partitioner::Balance balance;  ///< layers per virtual stage (stages · chunks entries); empty: uniform
  schedule::Kind schedule = schedule::Kind::GPipe;  ///< one of the table's kinds (schedule/kinds.h)
  int chunks = 1;  ///< virtual stages per device (schedule::info(kind).default_chunks for kinds with chunks)
  Recompute recompute = Recompute::ExceptLast;  ///< which micro-batches re-run their forward in backward
  /// The weight gradients of linear layers computed once per step, as one GEMM over every
  /// micro-batch's rows, instead of added micro-batch by micro-batch (models/weight_grads.h): less
  /// memory traffic on a CPU, at the price of keeping each linear layer's input and output gradient
  /// of every micro-batch until the end of the stage's list. CPU stages only. Weights under
  /// `defer_min_bytes` (which stay in cache between micro-batches) are not deferred. One process
  /// per stage: every rank runs rank 0's choice (a run that decided it by profiling may differ).
  bool defer_weight_grads = false;
  int64_t defer_min_bytes = 1 << 20;  ///< see defer_weight_grads
  /// GPU stages: each stage's forward and backward of each micro-batch captured in CUDA graphs in
  /// its second step and replayed after (stages/graphs.h), which saves the kernel launches of
  /// small layers. A stage where they cannot apply runs eagerly and says why in one line
  /// (cuda_graphs_refused, and in its first step a random or TorchScript layer or skips crossing).
  bool cuda_graphs = false;
  int intra_op_threads = 1;  ///< libtorch intra-op threads in each stage thread
  /// Where each device's stages run (stages/device.h: resolve_devices makes this from names):
  /// empty, every stage on the CPU; one device, every stage there; else one per device (several
  /// may share a GPU). The stage's layers are moved there (the caller's model with them: the
  /// modules are shared), and so are its optimizer state, the first stage's inputs and the last
  /// stage's targets; predict() returns the output on the last stage's device. Multi-process: the
  /// entry of this rank's device.
  std::vector<c10::Device> devices;
  /// Tests: every stage runs in the checking CPU context (stages/device.h), which delays each
  /// copy between stages until its wait, so that a missing wait corrupts the result.
  bool checking_contexts = false;
  double timeout_s = 300;    ///< longest wait for a message from another stage
  uint64_t seed = 0;         ///< seeds the random streams of dropout (common/rng.h)
  /// The compute dtype of every stage's forward (common/precision.h); parameters, gradients and
  /// optimizer state stay those of the model, which must be float32 for bf16 and fp16. Activations
  /// and their gradients cross between stages in the dtype the layers produced (the autocast dtype
  /// for products, convolutions and what follows them).
  Precision precision = Precision::FP32;
  LossScaleOptions loss_scale;  ///< fp16 only
  comm::TransportOptions transport;  ///< how the stages talk (in-process: the local transport)
  /// Data parallelism (pipeline/replicas.h): D copies of the pipeline, copy d training on the
  /// d-th of D near-equal, consecutive shards of every batch; each stage's gradients are summed
  /// across its D copies after its last backward, so a step equals one device's step on the whole
  /// batch. In-process the copies are more stage threads of this process (D x stages), copy 0
  /// being the caller's model; multi-process the world holds stages x D ranks, pipeline outer and
  /// data inner: rank = device * D + copy.
  int data_parallel = 1;
  /// Skip connections (models/skip.h): empty, the layers declare them (models::SkipDeclaring);
  /// else the skips of layers that stash and pop without declaring.
  std::vector<models::Skip> skips;
  /// Tied parameters (models::Tie): each member keeps its own tensor on its own stage; after the
  /// backward of a step their gradients are summed (in member order, on every rank alike) and
  /// every member takes the same update, so they stay equal bit for bit. The first member is the
  /// one that counts in the gradient norm and that checkpoints and exports store.
  std::vector<models::Tie> ties;
  bool shard_optimizer = false;     ///< ZeRO stage 1: each copy keeps the optimizer state of 1/D of a stage's parameters
  /// How a sharded optimizer's gradients are reduced: a reduce-scatter, or an all-reduce of which
  /// each copy keeps its slice (the same bytes held). Auto: the all-reduce on Gloo, whose
  /// reduce-scatter measured 1.4-2.4 times slower than its all-reduce here; the reduce-scatter
  /// on other backends.
  enum class ShardReduction { Auto, ReduceScatter, AllReduce };
  ShardReduction shard_reduction = ShardReduction::Auto;  ///< see ShardReduction
  int64_t bucket_bytes = 25 << 20;  ///< gradients reduced per operation
};

/// Why PipelineOptions::cuda_graphs cannot apply to a stage on `device` under `o` ("a CPU stage",
/// "recomputation ...", "a split backward ..."), or "" where it may.
std::string cuda_graphs_refused(const PipelineOptions& o, const c10::Device& device);

/// A gradient with a NaN or an infinity, found by StageOptimizers::step() before any parameter changed.
class NonFiniteGradient : public Error {
 public:
  NonFiniteGradient(int stage, const std::string& what) : Error(what), stage_(stage) {}  ///< at `stage`
  int stage() const { return stage_; }  ///< the stage whose gradients are not finite

 private:
  int stage_;
};

/// A model split into stages that train it together on a schedule: the pipeline's C++ API.
/// One object runs every stage as a thread of this process, or (with an endpoint) this
/// process's rank of a multi-process pipeline; every call is then collective.
class Pipeline {
 public:
  /// `loss` returns the mean loss of one micro-batch (e.g. cross-entropy with mean reduction);
  /// the pipeline weights it by the micro-batch's share of the batch, so the step's loss is the
  /// mean over the whole batch even when the batch does not divide evenly.
  Pipeline(torch::nn::Sequential model, PipelineOptions options, stages::LossFn loss);
  /// One rank of a multi-process pipeline (runtime.kind processes): this process runs device
  /// endpoint->rank() of endpoint->world_size() == options.stages, and its peers run the others
  /// with the same model, options and seed. Every call below is then collective: each rank makes
  /// the same calls in the same order, and the results that one rank computes (the loss, the
  /// gradient norm) are exchanged so that every rank returns the same value. The stage layout is
  /// rank 0's (e.g. a profiled balance). The layers of other ranks' stages are released (their
  /// parameters and buffers become empty tensors). Any rank's failure, this constructor's included,
  /// fails the call on every rank (a peer that fails or dies at once, one that stops answering after
  /// options.timeout_s), naming the rank; after a failed step the pipeline cannot be used again.
  ///
  /// With options.data_parallel = D > 1 the endpoint's world holds stages x D ranks (rank =
  /// device * D + copy, comm::Mesh) and `copies` is the c10d group of the D ranks that run this rank's
  /// device (comm/process_group.h); the loss, the gradient norm and the control plane are then
  /// those of the whole world.
  Pipeline(torch::nn::Sequential model, PipelineOptions options, stages::LossFn loss,
           std::unique_ptr<comm::Transport> endpoint, comm::ProcessGroup copies = {});
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  /// The stage optimizers: set them, step them, clip, scale (optimizers.h).
  StageOptimizers& optimizers();

  /// Data parallelism: whether the next forward_backward reduces the gradients across the copies
  /// (default on). Turn it off for all but the last of several accumulated batches, as DDP's
  /// no_sync; StageOptimizers::step() reduces gradients left unreduced.
  void sync_gradients(bool on);
  /// After parameters, buffers or optimizer state were loaded (into copy 0 in-process, into every
  /// rank multi-process): copies 1..D-1 of an in-process pipeline take copy 0's, and a sharded
  /// optimizer's slices are read again from the parameters.
  void sync_copies();

  /// Zeroes gradients, runs forward and backward of every micro-batch, and (when an optimizer
  /// is set) steps every stage's optimizer. Returns the batch's mean loss.
  double train_step(const at::Tensor& input, const at::Tensor& target);

  /// Forward and backward only: gradients go into the parameters' .grad, cleared first unless
  /// `accumulate` (several batches for one optimizer step). `scale` multiplies every micro-batch's
  /// loss weight: with 1/k over k accumulated batches the gradient is that of their mean loss.
  /// Returns the (scaled) loss. A call that succeeds updates each models::BatchNorm's running
  /// statistics once, from all the micro-batches it saw, as one forward over their union would;
  /// a call that fails changes none.
  ///
  /// Where the gradient is after a call that reduced it (sync_gradients on, the default):
  ///  - one copy, or data_parallel > 1 without a sharded optimizer: every parameter's .grad holds
  ///    the whole batch's gradient (summed across the copies);
  ///  - a sharded optimizer (options.shard_optimizer, data_parallel > 1): every parameter's .grad
  ///    is undefined; each copy holds the reduced gradient of its slice of the stage's flattened
  ///    parameters, which its optimizer steps. optimizers().gather_grads() puts the whole reduced
  ///    gradient into every parameter's .grad when you need to read it (a collective).
  double forward_backward(const at::Tensor& input, const at::Tensor& target, bool accumulate = false,
                          double scale = 1.0);

  /// Forward of the whole batch in evaluation mode, without gradients or recomputation, pipelined:
  /// the batch flows through the stages as the configured micro-batches, on a forward-only
  /// schedule (schedule::forward_only) run by the same executor as a training step. Multi-process:
  /// only the rank that runs the last stage returns the output; the others return an undefined
  /// tensor.
  at::Tensor predict(const at::Tensor& input);

  /// The parallel layout: stages x data-parallel copies (comm/mesh.h).
  const comm::Mesh& mesh() const;
  /// Multi-process runtime (in-process, every device is local and these are trivial):
  int rank() const;                  ///< this process's rank (mesh().rank(device, copy)); -1 in-process
  int copy() const;                  ///< this process's copy (multi-process); 0 in-process
  bool is_local(int device) const;   ///< whether this process runs `device`
  bool is_local_stage(int virtual_stage) const;  ///< whether this process runs that virtual stage
  /// The control plane among the ranks (comm/collectives.h: all-gather, broadcast, barrier,
  /// abort), for the caller's own agreements (the run layer gathers checkpoint shards and stops
  /// together over it). Multi-process it shares the pipeline's endpoint and sequence: every rank
  /// makes the same calls in the same order, interleaved with the pipeline's. Aborting it ends the
  /// pipeline on every rank (peers fail at once, naming this rank). In-process: a group of one.
  comm::Collectives& collectives();
  int rank_of(int device) const;  ///< the rank that runs `device` (copy 0's); in-process 0

  int stages() const;  ///< devices; each runs `chunks` virtual stages
  const partitioner::Balance& balance() const;  ///< layers per virtual stage
  const schedule::Schedule& schedule() const;  ///< the action lists of the last step (or the configured ones)
  const StepTrace& last_trace() const;         ///< what the executor measured in the last step
  int64_t step() const;  ///< forward-backward passes run so far: the step of the dropout streams
  /// The fewest micro-batches a forward-backward ran since the last optimizer step: fewer than
  /// configured when a batch (an epoch's last) had fewer samples than micro-batches, each of its
  /// micro-batches then holding one sample (or as the schedule kind allows, e.g. a multiple of
  /// the stages for interleaved-1f1b). Its loss and gradients are still one device's on it.
  int fewest_micro_batches() const;
  /// The most memory `device`'s allocator held since the last call (a GPU stage: the CUDA caching
  /// allocator's peak; 0 for a CPU stage or another rank's device); each call starts the next peak.
  int64_t take_device_peak(int device);
  /// Tied parameters (PipelineOptions::ties): (follower, first member) names, "layer.parameter",
  /// for checkpoints, which store a tie once.
  const std::vector<std::pair<std::string, std::string>>& tied_names() const;
  void set_step(int64_t step);  ///< continues the streams of a resumed run
  torch::nn::Sequential& stage_layers(int virtual_stage);  ///< multi-process: another rank's are released

  /// Deprecated (0.1.0's spelling, removed in 0.3.0; CHANGELOG.md): optimizers().set(factory).
  [[deprecated("use optimizers().set")]] void set_optimizer(OptimizerFactory factory) {
    optimizers().set(std::move(factory));
  }
  /// Deprecated (0.1.0's spelling, removed in 0.3.0): optimizers().step().
  [[deprecated("use optimizers().step")]] double step_optimizer() { return optimizers().step(); }
  /// Deprecated (0.1.0's spelling, removed in 0.3.0): optimizers().set_grad_clip(max_norm).
  [[deprecated("use optimizers().set_grad_clip")]] void set_grad_clip(double max_norm) {
    optimizers().set_grad_clip(max_norm);
  }
  /// Deprecated (0.1.0's spelling, removed in 0.3.0): optimizers().set_learning_rate(lr).
  [[deprecated("use optimizers().set_learning_rate")]] void set_learning_rate(double lr) {
    optimizers().set_learning_rate(lr);
  }

 private:
  std::unique_ptr<Copies> copies_;
  std::unique_ptr<StageOptimizers> optimizers_;
};

}  // namespace pipetrain::pipeline
