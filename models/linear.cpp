// A linear layer whose weight gradient is added into the weight's .grad by its own GEMM.
//
// A pipeline step runs M micro-batches through each layer, so each weight gradient arrives M
// times; through autograd's AccumulateGrad the first is kept and every later one is computed into
// a fresh tensor and then added (grad += dW_m): an extra read and write of the whole gradient per
// micro-batch, which is memory traffic the plain loop (one large GEMM) never pays. Here the
// backward computes dW_m straight into .grad (addmm_ with beta 1, as Megatron's gradient
// accumulation fusion does), and returns no weight gradient to autograd. Where that is not safe
// it defers to libtorch's own linear: under autocast (the weight's gradient is not the GEMM's
// dtype), when a graph of the backward is being built, or when .grad is not a plain dense tensor
// of the weight's shape and dtype.
//
// With a WeightGradStash in place on the calling thread (models/weight_grads.h), the weight's
// gradient is not computed here at all: the micro-batch's output gradient and input are kept, and
// the stash's flush computes the gradient once for every micro-batch of the step.
//
// Which gradients to compute comes from the running backward (needs_input_grad): a zero-bubble
// stage's input-gradient pass (B) leaves the weight's alone, and its weight pass (W) then adds it.
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "models/layers.h"
#include "models/weight_grads.h"

namespace pipetrain::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The gradients of x·weightᵀ (+ bias) given the output's, the weight's added into its .grad.
variable_list linear_backward(AutogradContext* ctx, const at::Tensor& gy, bool has_bias) {
  const auto saved = ctx->get_saved_variables();
  const at::Tensor& x = saved[0];
  at::Tensor weight = saved[1];  // the parameter itself (a leaf is saved as itself)
  at::Tensor gx, gw, gb;
  if (!gy.defined()) return {gx, gw, gb};
  if (ctx->needs_input_grad(0)) gx = gy.matmul(weight);
  const at::Tensor gy2 = gy.reshape({-1, gy.size(-1)});
  if (ctx->needs_input_grad(1)) {
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});
    at::Tensor& grad = weight.mutable_grad();
    WeightGradStash* stash = current_weight_grad_stash();
    if (stash && stash->takes(weight) && !at::GradMode::is_enabled() && gy2.scalar_type() == weight.scalar_type() &&
        x2.scalar_type() == weight.scalar_type() && gy2.device() == weight.device()) {
      stash->add(weight, gy2, x2);  // computed once for the step, by WeightGradStash::flush
    } else if (grad.defined() && !at::GradMode::is_enabled() && grad.layout() == c10::kStrided && grad.is_contiguous() &&
        grad.sizes() == weight.sizes() && grad.scalar_type() == gy2.scalar_type() && grad.device() == gy2.device()) {
      grad.addmm_(gy2.t(), x2);  // into .grad; autograd gets no weight gradient to add
    } else {
      gw = gy2.t().mm(x2);  // the first micro-batch's: AccumulateGrad keeps it as .grad
    }
  }
  if (has_bias && ctx->needs_input_grad(2)) gb = gy2.sum(0);
  if (!has_bias) return {gx, gw};
  return {gx, gw, gb};
}

class AccumulatingLinear : public torch::autograd::Function<AccumulatingLinear> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
    ctx->save_for_backward({x, weight});
    return at::linear(x, weight, bias);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) { return linear_backward(ctx, grad_out[0], true); }
};

// Without a bias (autograd's functions take no undefined tensor as an input).
class AccumulatingLinearNoBias : public torch::autograd::Function<AccumulatingLinearNoBias> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight) {
    ctx->save_for_backward({x, weight});
    return at::linear(x, weight);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) { return linear_backward(ctx, grad_out[0], false); }
};

}  // namespace

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const bool plain = !weight.requires_grad() || !at::GradMode::is_enabled() || !weight.is_leaf() ||
                     at::autocast::is_autocast_enabled(x.device().type()) || x.dim() < 1;
  if (plain) return torch::linear(x, weight, bias);
  return bias.defined() ? AccumulatingLinear::apply(x, weight, bias) : AccumulatingLinearNoBias::apply(x, weight);
}

}  // namespace pipetrain::models
