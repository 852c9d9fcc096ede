#include "job/fused_optimizers.h"

#include <map>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace pipetrain::job {

namespace {

// A group's parameters with gradients, split by device and dtype (one fused call each).
using Key = std::pair<std::string, int>;
Key key_of(const at::Tensor& p) { return {p.device().str(), static_cast<int>(p.scalar_type())}; }

at::Tensor closure_loss(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) return {};
  at::AutoGradMode grad(true);
  return closure();
}

void check_dense(const at::Tensor& grad) {
  TORCH_CHECK(!grad.is_sparse(), "the fused optimizers take no sparse gradients");
}

struct AdamLists {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
};

// Adam and AdamW: the state as libtorch's loop makes it, every step counted, then one fused
// kernel per device and dtype.
template <class Options, class State>
void adam_step(torch::optim::Optimizer& opt,
               ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>>& state, bool decoupled) {
  for (auto& group : opt.param_groups()) {
    auto& o = static_cast<Options&>(group.options());
    std::map<Key, AdamLists> lists;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      check_dense(p.grad());
      auto& slot = state[p.unsafeGetTensorImpl()];
      if (!slot) {
        auto s = std::make_unique<State>();
        s->step(0);
        s->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        s->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        if (o.amsgrad()) s->max_exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(s);
      }
      auto& s = static_cast<State&>(*slot);
      s.step(s.step() + 1);
      AdamLists& l = lists[key_of(p)];
      l.params.push_back(p);
      l.grads.push_back(p.grad());
      l.exp_avgs.push_back(s.exp_avg());
      l.exp_avg_sqs.push_back(s.exp_avg_sq());
      if (o.amsgrad()) l.max_exp_avg_sqs.push_back(s.max_exp_avg_sq());
      l.steps.push_back(torch::full({}, static_cast<double>(s.step()), torch::TensorOptions(torch::kFloat).device(p.device())));
    }
    const auto [beta1, beta2] = o.betas();
    for (auto& [key, l] : lists) {
      if (decoupled)
        at::_fused_adamw_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.max_exp_avg_sqs, l.steps, o.lr(), beta1, beta2,
                          o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false);
      else
        at::_fused_adam_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.max_exp_avg_sqs, l.steps, o.lr(), beta1, beta2,
                         o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false);
    }
  }
}

}  // namespace

at::Tensor FusedSGD::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss = closure_loss(closure);
  for (auto& group : param_groups()) {
    auto& o = static_cast<torch::optim::SGDOptions&>(group.options());
    struct Lists {
      std::vector<at::Tensor> params, grads, buffers;
      bool first = false;  // the buffers are new: the kernel starts them from the gradients
    };
    std::map<std::pair<Key, bool>, Lists> lists;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      check_dense(p.grad());
      at::Tensor buffer;
      bool first = false;
      if (o.momentum() != 0) {
        auto& slot = state_[p.unsafeGetTensorImpl()];
        if (!slot) {
          auto s = std::make_unique<torch::optim::SGDParamState>();
          s->momentum_buffer(torch::empty_like(p, at::MemoryFormat::Preserve));
          slot = std::move(s);
          first = true;
        }
        buffer = static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer();
      }
      Lists& l = lists[{key_of(p), first}];
      l.first = first;
      l.params.push_back(p);
      l.grads.push_back(p.grad());
      if (buffer.defined()) l.buffers.push_back(buffer);
    }
    for (auto& [key, l] : lists)
      at::_fused_sgd_(l.params, l.grads, l.buffers, o.weight_decay(), o.momentum(), o.lr(), o.dampening(), o.nesterov(),
                      /*maximize=*/false, l.first);
  }
  return loss;
}

at::Tensor FusedAdam::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss = closure_loss(closure);
  adam_step<torch::optim::AdamOptions, torch::optim::AdamParamState>(*this, state_, /*decoupled=*/false);
  return loss;
}

at::Tensor FusedAdamW::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss = closure_loss(closure);
  adam_step<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(*this, state_, /*decoupled=*/true);
  return loss;
}

}  // namespace pipetrain::job
