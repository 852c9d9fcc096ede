#include "stages/stage.h"

#include <torch/torch.h>

#include "common/error.h"

namespace pipetrain::stages {

Recompute parse_recompute(const std::string& name) {
  if (name == "always") return Recompute::Always;
  if (name == "except_last") return Recompute::ExceptLast;
  if (name == "never") return Recompute::Never;
  throw ConfigError("unknown recomputation mode '" + name + "' (always, except_last, never)");
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::Always: return "always";
    case Recompute::ExceptLast: return "except_last";
    case Recompute::Never: return "never";
  }
  return "?";
}

Stage::Stage(int index, int num_stages, torch::nn::Sequential layers, Recompute recompute)
    : index_(index), num_stages_(num_stages), layers_(std::move(layers)), recompute_(recompute) {}

void Stage::begin_step(uint64_t seed, int64_t step, int micro_batches) {
  seed_ = seed;
  step_ = step;
  micro_batches_ = micro_batches;
  saved_.clear();
}

bool Stage::checkpointed(int m) const {
  switch (recompute_) {
    case Recompute::Always: return true;
    case Recompute::ExceptLast: return m != micro_batches_ - 1;
    case Recompute::Never: return false;
  }
  return false;
}

at::Tensor Stage::as_leaf(const at::Tensor& input) const {
  // The first stage needs no input gradient; integer inputs (tokens) cannot have one.
  if (is_first() || !input.is_floating_point()) return input;
  return input.detach().requires_grad_(true);
}

at::Tensor Stage::run(const Saved& s) {
  RngContextGuard rng(s.rng);
  at::Tensor out = layers_->forward(s.input);
  if (!is_last()) return out;
  PIPETRAIN_CHECK(loss_, "the last stage has no loss function");
  return loss_(out, s.target) * s.weight;
}

at::Tensor Stage::forward(int m, const at::Tensor& input, int64_t sample_offset,
                          const at::Tensor& target, double weight) {
  PIPETRAIN_CHECK(!saved_.count(m), "stage ", index_, " ran forward twice for micro-batch ", m);
  PIPETRAIN_CHECK(!is_last() || target.defined(), "the last stage needs targets");
  Saved s;
  s.target = target;
  s.weight = weight;
  s.rng = RngContext{seed_, step_, sample_offset};
  at::Tensor result;
  if (checkpointed(m)) {
    torch::NoGradGuard no_grad;
    s.input = input;
    result = run(s);
  } else {
    s.input = as_leaf(input);
    s.output = run(s);
    result = s.output.detach();
  }
  saved_.emplace(m, std::move(s));
  return result;
}

at::Tensor Stage::backward(int m, const at::Tensor& grad_output) {
  auto it = saved_.find(m);
  PIPETRAIN_CHECK(it != saved_.end(), "stage ", index_, " backward for micro-batch ", m,
                  " without its forward");
  Saved s = std::move(it->second);
  saved_.erase(it);
  if (!s.output.defined()) {  // checkpointed: rebuild the graph with the same random masks
    s.input = as_leaf(s.input);
    s.output = run(s);
  }
  if (s.output.requires_grad()) {
    if (is_last()) {
      s.output.backward();
    } else {
      PIPETRAIN_CHECK(grad_output.defined(), "stage ", index_, " needs an output gradient");
      s.output.backward(grad_output);
    }
  }
  if (is_first() || !s.input.requires_grad()) return {};
  at::Tensor g = s.input.grad();
  return g.defined() ? g : torch::zeros_like(s.input);
}

}  // namespace pipetrain::stages
