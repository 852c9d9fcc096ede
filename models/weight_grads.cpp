// The deferred weight gradients of linear layers (weight_grads.h).
#include "models/weight_grads.h"

#include <torch/torch.h>

namespace pipetrain::models {

namespace {
WeightGradStash*& slot() {
  thread_local WeightGradStash* stash = nullptr;
  return stash;
}
}  // namespace

WeightGradStash* current_weight_grad_stash() { return slot(); }

DeferWeightGrads::DeferWeightGrads(WeightGradStash* stash) : previous_(slot()) { slot() = stash; }
DeferWeightGrads::~DeferWeightGrads() { slot() = previous_; }

void WeightGradStash::add(const at::Tensor& weight, at::Tensor grad_output, at::Tensor input) {
  auto [it, fresh] = index_.emplace(weight.unsafeGetTensorImpl(), entries_.size());
  if (fresh) entries_.push_back({weight, {}, {}});
  Entry& e = entries_[it->second];
  e.grad_outputs.push_back(std::move(grad_output));
  e.inputs.push_back(std::move(input));
}

void WeightGradStash::flush() {
  torch::NoGradGuard no_grad;
  for (Entry& e : entries_) {
    // One GEMM over every micro-batch's rows; a single micro-batch needs no copy.
    const at::Tensor gy = e.grad_outputs.size() == 1 ? e.grad_outputs[0] : at::cat(e.grad_outputs, 0);
    const at::Tensor x = e.inputs.size() == 1 ? e.inputs[0] : at::cat(e.inputs, 0);
    e.grad_outputs.clear();
    e.inputs.clear();
    at::Tensor& grad = e.weight.mutable_grad();
    if (!grad.defined())
      grad = gy.t().mm(x);
    else if (grad.layout() == c10::kStrided && grad.is_contiguous() && grad.scalar_type() == gy.scalar_type() &&
             grad.device() == gy.device())
      grad.addmm_(gy.t(), x);
    else
      grad = grad + gy.t().mm(x).to(grad.options());
  }
  clear();
}

void WeightGradStash::clear() {
  entries_.clear();
  index_.clear();
}

int64_t WeightGradStash::bytes() const {
  int64_t n = 0;
  for (const Entry& e : entries_) {
    for (const auto& t : e.grad_outputs) n += static_cast<int64_t>(t.nbytes());
    for (const auto& t : e.inputs) n += static_cast<int64_t>(t.nbytes());
  }
  return n;
}

}  // namespace pipetrain::models
