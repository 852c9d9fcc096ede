#include "stages/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <limits>
#include <unordered_set>

namespace pipetrain::stages {

c10::ScalarType autocast_dtype(Precision p) {
  switch (p) {
    case Precision::FP32: return c10::kFloat;
    case Precision::BF16: return c10::kBFloat16;
    case Precision::FP16: return c10::kHalf;
  }
  return c10::kFloat;
}

AutocastGuard::AutocastGuard(Precision p, c10::DeviceType device) : active_(p != Precision::FP32), device_(device) {
  if (!active_) return;
  was_enabled_ = at::autocast::is_autocast_enabled(device_);
  was_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_dtype(device_, autocast_dtype(p));
  at::autocast::set_autocast_enabled(device_, true);
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  at::autocast::set_autocast_enabled(device_, was_enabled_);
  at::autocast::set_autocast_dtype(device_, was_dtype_);
}

void clear_autocast_cache() { at::autocast::clear_cache(); }

void run_weight_casts_first(const std::vector<at::Tensor>& roots) {
  using torch::autograd::Node;
  constexpr uint64_t kFirst = std::numeric_limits<uint64_t>::max();  // AccumulateGrad's own
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const at::Tensor& r : roots)
    if (r.defined() && r.grad_fn() && seen.insert(r.grad_fn().get()).second) stack.push_back(r.grad_fn().get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    const auto& edges = n->next_edges();
    if (edges.size() == 1 && edges[0].function &&
        dynamic_cast<torch::autograd::AccumulateGrad*>(edges[0].function.get()) != nullptr) {
      n->set_sequence_nr(kFirst);
      continue;
    }
    for (const auto& e : edges)
      if (e.function && e.function->sequence_nr() != kFirst && seen.insert(e.function.get()).second)
        stack.push_back(e.function.get());
  }
}

}  // namespace pipetrain::stages
