// stages: one contiguous slice of a model's layers on one device. A stage runs forward and
// backward per micro-batch and decides, per micro-batch, whether to keep the activations
// (autograd graph) or only the input and recompute in backward. Recomputation restores the
// RNG context saved at forward time, so random layers draw the same masks again, and marks the
// thread as recomputing (common/recompute.h), so BatchNorm does not count the micro-batch twice.
// Under a reduced precision (common/precision.h) every forward, recomputation included, runs
// under autocast on the calling thread (stages/autocast.h); backward runs in the dtypes the
// forward chose.
//
// Skip connections (common/skip.h, models/skip.h): besides its input a stage may receive named skip tensors
// stashed by earlier stages, and besides its output pass on those its layers stashed or did not
// pop; backward takes the gradients of the skips it passed on and gives those of the skips it
// received. A skip that only passes through keeps its gradient unchanged.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include "common/precision.h"
#include "common/recompute.h"
#include "common/rng.h"
#include "common/skip.h"
#include "stages/graphs.h"

namespace pipetrain::stages {

// Mean loss of one micro-batch; the stage scales it by the micro-batch's share of the batch.
using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;
using Skips = SkipMap<at::Tensor>;  // named skip tensors (common/skip.h)

class Stage {
 public:
  Stage(int index, int num_stages, torch::nn::Sequential layers, Recompute recompute);

  int index() const { return index_; }
  bool is_first() const { return index_ == 0; }
  bool is_last() const { return index_ == num_stages_ - 1; }
  torch::nn::Sequential& layers() { return layers_; }

  // The last stage turns its output into the loss.
  void set_loss(LossFn loss) { loss_ = std::move(loss); }
  void set_precision(Precision p) { precision_ = p; }
  Precision precision() const { return precision_; }

  // Runs the layers' forward as a stage forward does (under the precision's autocast), without
  // keeping anything: evaluation and profiling. `skips_out`: the skips it passes on.
  at::Tensor forward_only(const at::Tensor& input, const Skips& skips_in = {}, Skips* skips_out = nullptr);

  // Starts a step: forgets any state of the previous one, and the calling thread's autocast
  // cache (weights cast before an optimizer step must not be used after it).
  void begin_step(uint64_t seed, int64_t step, int micro_batches);

  bool recomputes(int micro_batch) const;

  // Runs micro-batch `m`. `sample_offset` is its first sample's index in the mini-batch (for the
  // RNG context). On the last stage `target` and `weight` (the micro-batch's share of the batch)
  // give the loss, and the returned tensor is the weighted loss; elsewhere it is the output.
  // `skips_in`: the skips that crossed into this stage; `skips_out` receives those it passes on
  // (detached). The last stage passes none on (an error naming a skip left unpopped).
  at::Tensor forward(int m, const at::Tensor& input, int64_t sample_offset,
                     const at::Tensor& target = {}, double weight = 1.0, const Skips& skips_in = {},
                     Skips* skips_out = nullptr);

  // Backpropagates micro-batch `m` given the gradient of its output (undefined on the last
  // stage) and returns the gradient of its input (undefined on the first stage). `skip_grads`:
  // the gradients of the skips it passed on; `skip_grads_in` receives those of the skips it
  // received (zeros where none reached them).
  at::Tensor backward(int m, const at::Tensor& grad_output, const Skips& skip_grads = {},
                      Skips* skip_grads_in = nullptr);

  // Zero-bubble split of backward(). backward_input() computes only the gradient of the input
  // and keeps, for backward_weight(), the autograd nodes where the weight gradients branch off
  // the input path, with the gradients that reached them; everything else of the graph is
  // released. backward_weight() then runs only those branches, so no work is done twice. On a
  // stage whose input needs no gradient (the first stage), B does nothing and W is the whole
  // backward.
  at::Tensor backward_input(int m, const at::Tensor& grad_output, const Skips& skip_grads = {},
                            Skips* skip_grads_in = nullptr);
  void backward_weight(int m);

  // PipelineOptions::cuda_graphs (stages/graphs.h): from its second step on, this stage's
  // forward and backward of each micro-batch index run from CUDA graphs. `refused`: why they
  // cannot ("a CPU stage", "recomputation ..."), "" when they may; the stage may still find a
  // reason in its first step (a random or TorchScript layer, skips crossing), then it runs
  // eagerly and graphs_refused() says why.
  void use_cuda_graphs(const std::string& refused);
  // Why this stage runs eagerly though graphs were asked for ("" while they apply or were not).
  const std::string& graphs_refused() const { return graphs_refused_; }
  // Forwards of the current step that ran from a graph.
  int graphed_forwards() const { return graphed_forwards_; }

  // Micro-batches whose activations or inputs are still held (forward done, backward not).
  size_t held() const { return saved_.size(); }
  // Seconds the last backward or backward_input spent re-running the forward (0 if it kept
  // the activations).
  double last_recompute_s() const { return last_recompute_s_; }

  // Micro-batches between backward_input and backward_weight.
  size_t awaiting_weight() const { return weight_work_.size(); }

  ~Stage();

 private:
  struct Saved {
    at::Tensor input;   // leaf that requires grad (stage > 0), or the raw input
    at::Tensor output;  // graph output, or the weighted loss on the last stage; undefined if recomputed
    at::Tensor target;
    double weight = 1.0;
    at::Tensor weight_on_device;  // a graphed forward's (0-dimensional float32, stages/graphs.h): used instead of `weight`
    RngContext rng;
    Skips skips_in;   // as `input`: leaves, or raw
    Skips skips_out;  // as `output`: what the layers passed on (a skip only passing through is its leaf)
  };
  struct WeightWork;  // defined in stage.cpp: autograd nodes and gradients kept for W
  Saved take(int m);  // removes micro-batch m's saved state, rebuilding the graph if recomputed
  at::Tensor run(const Saved& s, Skips* left);  // `left`: the skips the layers pass on
  at::Tensor as_leaf(const at::Tensor& input) const;
  Skips as_leaves(const Skips& skips) const;
  // The roots of a backward (the output and the skips it produced) with their gradients, and
  // the gradients of the received skips that only passed through.
  void backward_roots(const Saved& s, const at::Tensor& grad_output, const Skips& skip_grads,
                      std::vector<at::Tensor>& roots, std::vector<at::Tensor>& grads) const;
  static bool passes_through(const Saved& s, const std::string& name);
  void skip_grads_of(const Saved& s, const Skips& skip_grads, const std::map<std::string, at::Tensor>& computed,
                     Skips* out) const;

  int index_, num_stages_;
  torch::nn::Sequential layers_;
  Recompute recompute_;
  Precision precision_ = Precision::FP32;
  LossFn loss_;
  uint64_t seed_ = 0;
  int64_t step_ = 0;
  int micro_batches_ = 0;
  std::map<int, Saved> saved_;
  std::map<int, std::unique_ptr<WeightWork>> weight_work_;
  // CUDA graphs (use_cuda_graphs): asked for, why not, and the graphs once the first step has run.
  bool graphs_wanted_ = false;
  std::string graphs_refused_;
  int64_t steps_begun_ = 0;
  int graphed_forwards_ = 0;
  std::unique_ptr<StageGraphs> graphs_;
  std::vector<at::Tensor> graph_params_;          // the layers' parameters, taken when graphs_ is made
  at::ScalarType graph_weight_dtype_ = at::kFloat;  // the loss's dtype (the weight multiplies it)
  bool shape_said_ = false;  // a micro-batch of another shape than captured ran eagerly: said once
  at::Tensor graphed_forward(int m, Saved& s);  // undefined where it ran no graph
  void probe_graphs(const Saved& s);  // after a warm-up forward: anything a graph cannot replay
  double last_recompute_s_ = 0;
};

}  // namespace pipetrain::stages
