#include "stages/stage.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>
#include <unordered_set>

#include "common/error.h"
#include "common/recompute.h"
#include "stages/autocast.h"

namespace pipetrain::stages {

Stage::Stage(int index, int num_stages, torch::nn::Sequential layers, Recompute recompute)
    : index_(index), num_stages_(num_stages), layers_(std::move(layers)), recompute_(recompute) {}

void Stage::begin_step(uint64_t seed, int64_t step, int micro_batches) {
  seed_ = seed;
  step_ = step;
  micro_batches_ = micro_batches;
  saved_.clear();
  weight_work_.clear();  // a failed step may have left Bs without their W
  clear_autocast_cache();
}

bool Stage::recomputes(int m) const {
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
  AutocastGuard autocast(precision_, s.input.device().type());
  at::Tensor out = layers_->forward(s.input);
  if (!is_last()) return out;
  PIPETRAIN_CHECK(loss_, "the last stage has no loss function");
  // The loss is taken in float32 whatever the precision (autocast runs cross-entropy in float32).
  at::Tensor loss = loss_(out, s.target);
  if (c10::isReducedFloatingType(loss.scalar_type())) loss = loss.to(at::kFloat);
  return loss * s.weight;
}

at::Tensor Stage::forward_only(const at::Tensor& input) {
  AutocastGuard autocast(precision_, input.device().type());
  return layers_->forward(input);
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
  if (recomputes(m)) {
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

Stage::Saved Stage::take(int m) {
  auto it = saved_.find(m);
  PIPETRAIN_CHECK(it != saved_.end(), "stage ", index_, " backward for micro-batch ", m,
                  " without its forward");
  Saved s = std::move(it->second);
  saved_.erase(it);
  last_recompute_s_ = 0;
  if (!s.output.defined()) {  // recomputed: rebuild the graph with the same random masks
    const auto t0 = std::chrono::steady_clock::now();
    RecomputeGuard replay;  // the forward already counted this micro-batch (BatchNorm statistics)
    s.input = as_leaf(s.input);
    s.output = run(s);
    last_recompute_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return s;
}

at::Tensor Stage::backward(int m, const at::Tensor& grad_output) {
  Saved s = take(m);
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

// ---- Zero-bubble split ------------------------------------------------------------------------
//
// The autograd graph of a stage has an input path (nodes from which the input's gradient is
// reachable) and weight branches (nodes that reach only parameters). B asks the engine for the
// input gradient alone: nodes on the input path run but skip the outputs that feed parameters
// (each generated backward checks which of its outputs are needed). The nodes on the input path
// with an edge into a weight branch are the "intermediates": a pre-hook captures the gradient
// that reaches each of them. W re-enters the graph at the intermediates with those gradients and
// asks only for the parameters, so each intermediate now computes just its weight-side outputs
// (for a linear layer: B does grad·Wᵀ, W does xᵀ·grad and the bias sum).

namespace {
using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::variable_list;

struct Capture : torch::autograd::FunctionPreHook {
  std::shared_ptr<variable_list> grads = std::make_shared<variable_list>();
  variable_list operator()(const variable_list& incoming) override {
    *grads = incoming;
    return incoming;
  }
};
}  // namespace

struct Stage::WeightWork {
  std::vector<std::shared_ptr<Node>> nodes;         // intermediates, with their weight branches
  std::vector<std::shared_ptr<variable_list>> grads;  // gradient that reached each intermediate
  at::Tensor output, grad_output;                   // whole backward (stage input needs no grad)
};

Stage::~Stage() = default;

at::Tensor Stage::backward_input(int m, const at::Tensor& grad_output) {
  PIPETRAIN_CHECK(is_last() || grad_output.defined(), "stage ", index_, " needs an output gradient");
  PIPETRAIN_CHECK(!weight_work_.count(m), "stage ", index_, " ran backward_input twice for micro-batch ", m);
  Saved s = take(m);
  auto work = std::make_unique<WeightWork>();
  const bool need_input = !is_first() && s.input.requires_grad();
  at::Tensor result;
  if (s.output.requires_grad() && !need_input) {
    work->output = s.output;
    work->grad_output = is_last() ? torch::ones_like(s.output) : grad_output;
  } else if (s.output.requires_grad()) {
    namespace impl = torch::autograd::impl;
    const Edge root = impl::gradient_edge(s.output);
    const Edge input_edge = impl::gradient_edge(s.input);
    std::unordered_set<Node*> param_nodes;
    for (const auto& p : layers_->parameters())
      if (auto acc = impl::try_get_grad_accumulator(p)) param_nodes.insert(acc.get());

    // Which nodes reach the input and which reach a parameter (iterative post-order walk).
    std::unordered_map<Node*, std::pair<bool, bool>> reach;  // node -> (input, parameter)
    std::vector<std::pair<Node*, bool>> stack{{root.function.get(), false}};
    std::vector<Node*> order;
    while (!stack.empty()) {
      auto [n, expanded] = stack.back();
      stack.pop_back();
      if (expanded) {
        bool in = false, par = false;
        for (const Edge& e : n->next_edges()) {
          Node* c = e.function.get();
          if (!c) continue;
          in |= c == input_edge.function.get() || reach[c].first;
          par |= param_nodes.count(c) > 0 || reach[c].second;
        }
        reach[n] = {in, par};
        order.push_back(n);
        continue;
      }
      if (reach.count(n)) continue;
      reach[n] = {false, false};
      stack.push_back({n, true});
      for (const Edge& e : n->next_edges())
        if (e.function && !reach.count(e.function.get())) stack.push_back({e.function.get(), false});
    }

    if (!reach[root.function.get()].first) {
      // The output does not depend on the input through differentiable ops: the input gradient
      // is zero and the whole backward is weight work.
      work->output = s.output;
      work->grad_output = is_last() ? torch::ones_like(s.output) : grad_output;
      weight_work_.emplace(m, std::move(work));
      return torch::zeros_like(s.input);
    }
    std::vector<std::pair<Node*, Capture*>> hooks;
    for (Node* n : order) {
      if (!reach[n].first) continue;
      bool branches = false;
      for (const Edge& e : n->next_edges()) {
        Node* c = e.function.get();
        if (c && (param_nodes.count(c) || (reach[c].second && !reach[c].first))) branches = true;
      }
      if (!branches) continue;
      auto hook = std::make_unique<Capture>();
      hooks.push_back({n, hook.get()});
      work->grads.push_back(hook->grads);
      work->nodes.push_back(n->shared_from_this());
      n->add_pre_hook(std::move(hook));
    }

    const at::Tensor g = is_last() ? torch::ones_like(s.output) : grad_output;
    auto& engine = torch::autograd::Engine::get_default_engine();
    variable_list out = engine.execute({root}, {g}, /*keep_graph=*/true, /*create_graph=*/false,
                                       /*accumulate_grad=*/false, {input_edge});
    result = out.at(0);

    // Detach the intermediates from the input path: W must not push gradients down it again,
    // and the rest of the graph (activations only B needed) is released with `s`.
    for (auto& [n, hook] : hooks) {
      auto& pre = n->pre_hooks();
      pre.erase(std::remove_if(pre.begin(), pre.end(), [h = hook](const auto& p) { return p.get() == h; }),
                pre.end());
      for (Edge& e : n->next_edges()) {
        Node* c = e.function.get();
        if (c && (c == input_edge.function.get() || reach[c].first)) e = Edge();
      }
    }
  }
  weight_work_.emplace(m, std::move(work));
  if (is_first() || !s.input.requires_grad()) return {};
  return result.defined() ? result : torch::zeros_like(s.input);
}

void Stage::backward_weight(int m) {
  auto it = weight_work_.find(m);
  PIPETRAIN_CHECK(it != weight_work_.end(), "stage ", index_,
                  " backward_weight for micro-batch ", m, " without its backward_input");
  std::unique_ptr<WeightWork> work = std::move(it->second);
  weight_work_.erase(it);
  if (work->output.defined()) {
    work->output.backward(work->grad_output);
    return;
  }
  namespace impl = torch::autograd::impl;
  std::vector<Edge> params;
  for (const auto& p : layers_->parameters())
    if (auto acc = impl::try_get_grad_accumulator(p)) params.emplace_back(acc, 0);
  std::vector<Edge> roots;
  variable_list grads;
  for (size_t i = 0; i < work->nodes.size(); ++i)
    for (size_t k = 0; k < work->grads[i]->size(); ++k)
      if ((*work->grads[i])[k].defined()) {
        roots.emplace_back(work->nodes[i], static_cast<uint32_t>(k));
        grads.push_back((*work->grads[i])[k]);
      }
  if (roots.empty() || params.empty()) return;
  torch::autograd::Engine::get_default_engine().execute(
      roots, grads, /*keep_graph=*/false, /*create_graph=*/false, /*accumulate_grad=*/true, params);
}

}  // namespace pipetrain::stages
