// optimizers: the optimizer side of a Pipeline, apart from the executors that run the action
// lists: every stage's optimizer, and what happens between a step's last backward and the next
// forward — the gradient norm, clipping, the non-finite check, fp16 loss scaling, the learning
// rate and a sharded optimizer's state (gathered whole for checkpoints, scattered back). It runs
// on the pipeline's own stage workers; every call covers every data-parallel copy, and in a
// multi-process pipeline every call is collective, as Pipeline's are.
//
//   pipe.optimizers().set([](auto params) { return std::make_unique<torch::optim::SGD>(params, 0.1); });
//   pipe.optimizers().set_grad_clip(1.0);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <torch/optim/optimizer.h>

namespace pipetrain::pipeline {

class Copies;
struct OptimizerSide;

/// Builds the optimizer of one stage (one copy) over the parameters it owns.
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor> params)>;

/// The stage optimizers of a Pipeline (Pipeline::optimizers()).
class StageOptimizers {
 public:
  /// Each stage gets its own optimizer over its own parameters (with a sharded optimizer: over
  /// one tensor, this copy's slice of the stage's flattened parameters).
  void set(OptimizerFactory factory);
  /// Clips the global gradient norm (all stages together) to set_grad_clip's bound and steps every
  /// stage's optimizer; returns the norm before clipping (0 unless clipping or tracking is on).
  /// Reduces first the gradients a forward_backward without sync_gradients left unreduced.
  double step();
  /// The optimizer of a virtual stage; null before set() or for a stage without parameters.
  torch::optim::Optimizer* of(int virtual_stage);

  void track_grad_norm(bool on);  ///< compute the global norm even without clipping
  /// Check every stage's gradients before stepping: a NaN or infinity throws NonFiniteGradient
  /// naming the stage, and no parameter changes.
  void check_finite_grads(bool on);
  void set_grad_clip(double max_norm);  ///< 0: off (the default)
  void set_learning_rate(double lr);    ///< every stage's optimizer, every parameter group
  double last_grad_norm() const;        ///< of the last step

  /// fp16: the loss scale the next step runs with, and whether the last step was skipped because
  /// a gradient overflowed (somewhere: every stage and rank skips it, and the scale backs off).
  /// Under fp32 and bf16 the scale is 1 and no step is skipped here.
  double loss_scale() const;
  int64_t loss_scale_good_steps() const;  ///< steps since the scale last changed by an overflow or growth
  bool last_step_skipped() const;         ///< see loss_scale()
  void restore_loss_scale(double scale, int64_t good_steps);  ///< a resumed run (every rank the same)

  /// ZeRO-1 (shard_optimizer with more than one copy): each copy holds the state of its slice.
  bool sharded() const;
  /// Sharded: every parameter's .grad (on every copy) takes its stage's whole reduced gradient,
  /// all-gathered from the copies' slices, reducing first what the step left unreduced (tied
  /// parameters' stages, or a forward_backward without sync_gradients); for reading
  /// (the optimizer steps each copy's slice, which stays where it is). Collective, as gathered().
  /// Not sharded: nothing to do, .grad already holds the reduced gradient.
  void gather_grads();
  /// Sharded (checkpoints): an optimizer over the virtual stage's own parameters that holds the
  /// whole state, gathered from every copy's slice. Collective: every copy (rank) that runs the
  /// stage calls it, for the same stages in the same order. Null when not sharded.
  std::unique_ptr<torch::optim::Optimizer> gathered(int virtual_stage);
  /// Sharded: an optimizer over the stage's parameters without state (to load a checkpoint
  /// into); scatter() then gives every local copy its slice of that optimizer's state.
  std::unique_ptr<torch::optim::Optimizer> unsharded(int virtual_stage);
  void scatter(int virtual_stage, torch::optim::Optimizer& full);  ///< see unsharded()

 private:
  friend class Pipeline;
  explicit StageOptimizers(Copies& copies) : copies_(copies) {}
  const OptimizerSide& side() const;  // the first copy's, which answers for all
  Copies& copies_;
};

}  // namespace pipetrain::pipeline
