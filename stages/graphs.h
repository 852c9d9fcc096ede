// CUDA graphs per stage (PipelineOptions::cuda_graphs). A stage on a GPU runs its forwards
// eagerly for one step (the warm-up: libraries' lazy set-up, and the probe for layers a graph
// cannot replay, common/replayable.h); from its second step, each micro-batch index's forward
// and backward are captured once, on the stage's compute stream, into two graphs with a memory
// pool of their own (the pool holds that micro-batch's activations between its forward and its
// backward, as eager autograd would), and replayed after: the input, target and loss weight
// copied into the graph's static tensors, the output handed on as the eager one is. The
// backward graph computes the gradients of the input and of every parameter, which autograd
// then adds into .grad as it adds an eager backward's (make_graphed_callables' design).
// A micro-batch whose shapes differ from its capture (a short last batch) runs eagerly.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace pipetrain::stages {

/// The forward a graph captures: the stage's layers and, on the last stage, its loss times
/// `weight` (a 0-dimensional tensor of the loss's dtype on the device, filled before each replay).
using GraphBody = std::function<at::Tensor(const at::Tensor& input, const at::Tensor& target, const at::Tensor& weight)>;

/// One stage's graphs, by micro-batch index.
class StageGraphs {
 public:
  virtual ~StageGraphs() = default;
  /// Micro-batch `m`'s forward through its graphs: captured from `body` on the first call for
  /// `m`, replayed after. The result is attached to autograd: its backward replays m's backward
  /// graph and gives `input` (when it requires a gradient) and each of `params` theirs. An
  /// undefined result: m's shapes differ from its capture, and the caller runs it eagerly.
  /// `weight_dtype`: the loss's dtype (the weight multiplies it as the eager scalar would).
  virtual at::Tensor forward(int m, const at::Tensor& input, const at::Tensor& target, double weight,
                             at::ScalarType weight_dtype, const std::vector<at::Tensor>& params,
                             const GraphBody& body) = 0;
};

/// Graphs for a stage on `device`; nullptr where this build has no CUDA (stages/graphs_none.cpp).
std::unique_ptr<StageGraphs> make_stage_graphs(const c10::Device& device);

}  // namespace pipetrain::stages
