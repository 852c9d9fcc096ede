#include "stages/stage.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>
#include <unordered_set>

#include "common/error.h"
#include "common/strings.h"
#include "common/recompute.h"
#include "common/log.h"
#include "common/replayable.h"
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
  ++steps_begun_;
  graphed_forwards_ = 0;
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

Skips Stage::as_leaves(const Skips& skips) const {
  Skips out;
  for (const auto& [name, t] : skips) out[name] = t.is_floating_point() ? t.detach().requires_grad_(true) : t;
  return out;
}

at::Tensor Stage::run(const Saved& s, Skips* left) {
  RngContextGuard rng(s.rng);
  AutocastGuard autocast(precision_, s.input.device().type());
  SkipScope<at::Tensor> skips(s.skips_in);
  at::Tensor out = layers_->forward(s.input);
  Skips rest = skips.take();
  if (is_last() && !rest.empty())
    throw Error(detail::concat("stage ", index_, " (the last): skip '", rest.begin()->first,
                               "' is still stashed after the last layer; a later layer must pop it"));
  if (left) *left = std::move(rest);
  if (precision_ != Precision::FP32 && at::GradMode::is_enabled()) {
    std::vector<at::Tensor> roots{out};
    if (left)
      for (const auto& [name, t] : *left) roots.push_back(t);
    run_weight_casts_first(roots);
  }
  if (!is_last()) return out;
  PIPETRAIN_CHECK(loss_, "the last stage has no loss function");
  // The loss is taken in float32 whatever the precision (autocast runs cross-entropy in float32).
  at::Tensor loss = loss_(out, s.target);
  if (c10::isReducedFloatingType(loss.scalar_type())) loss = loss.to(at::kFloat);
  if (s.weight_on_device.defined()) return loss * s.weight_on_device;  // a graph's: filled before each replay
  // A weight of exactly 1 (one micro-batch, no loss scale) changes nothing: no multiply, and no
  // node for it in the graph, as the plain loop's unsplit loss.
  return s.weight == 1.0 ? loss : loss * s.weight;
}

at::Tensor Stage::forward_only(const at::Tensor& input, const Skips& skips_in, Skips* skips_out) {
  AutocastGuard autocast(precision_, input.device().type());
  SkipScope<at::Tensor> skips(skips_in);
  at::Tensor out = layers_->forward(input);
  if (skips_out) *skips_out = skips.take();
  return out;
}

at::Tensor Stage::forward(int m, const at::Tensor& input, int64_t sample_offset, const at::Tensor& target,
                          double weight, const Skips& skips_in, Skips* skips_out) {
  PIPETRAIN_CHECK(!saved_.count(m), "stage ", index_, " ran forward twice for micro-batch ", m);
  PIPETRAIN_CHECK(!is_last() || target.defined(), "the last stage needs targets");
  Saved s;
  s.target = target;
  s.weight = weight;
  s.rng = RngContext{seed_, step_, sample_offset};
  at::Tensor result;
  Skips left;
  if (recomputes(m)) {
    torch::NoGradGuard no_grad;
    s.input = input;
    s.skips_in = skips_in;
    result = run(s, &left);
  } else {
    s.input = as_leaf(input);
    s.skips_in = as_leaves(skips_in);
    s.output = graphed_forward(m, s);
    if (!s.output.defined()) {
      const bool probing = graphs_wanted_ && graphs_refused_.empty() && steps_begun_ == 1;
      if (probing) take_not_replayable();  // a note left by an earlier forward is not this one's
      s.output = run(s, &s.skips_out);
      if (probing) probe_graphs(s);
    }
    result = s.output.detach();
    for (const auto& [name, t] : s.skips_out) left[name] = t.detach();
  }
  if (skips_out) *skips_out = std::move(left);
  saved_.emplace(m, std::move(s));
  return result;
}

void Stage::use_cuda_graphs(const std::string& refused) {
  graphs_wanted_ = true;
  graphs_refused_ = refused;
  if (!refused.empty()) log::warning(detail::concat("stage ", index_, ": pipeline.cuda_graphs: runs eagerly: ", refused));
}

void Stage::probe_graphs(const Saved& s) {
  std::string why = take_not_replayable();
  if (why.empty() && (!s.skips_in.empty() || !s.skips_out.empty()))
    why = "skip connections cross the stage (graphs take one input and give one output)";
  if (why.empty()) return;
  graphs_refused_ = why;
  log::warning(detail::concat("stage ", index_, ": pipeline.cuda_graphs: runs eagerly: ", why));
}

at::Tensor Stage::graphed_forward(int m, Saved& s) {
  if (!graphs_wanted_ || !graphs_refused_.empty() || steps_begun_ < 2 || !s.skips_in.empty()) return {};
  if (!graphs_) {
    graphs_ = make_stage_graphs(s.input.device());
    if (!graphs_) {
      use_cuda_graphs(detail::concat("no CUDA graphs for a stage on ", s.input.device().str()));
      return {};
    }
    // The graphs read the parameters where they are (optimizers update them in place). The
    // loss's dtype: float32 under a reduced precision (run() takes it so), else the output's,
    // which is the parameters'.
    graph_params_ = layers_->parameters();
    if (precision_ == Precision::FP32)
      for (const at::Tensor& p : graph_params_)
        if (p.is_floating_point()) {
          graph_weight_dtype_ = p.scalar_type();
          break;
        }
  }
  const RngContext rng = s.rng;
  at::Tensor out = graphs_->forward(
      m, s.input, s.target, s.weight, graph_weight_dtype_, graph_params_,
      [this, rng](const at::Tensor& in, const at::Tensor& target, const at::Tensor& weight) {
        Saved t;
        t.input = in;
        t.target = target;
        t.weight_on_device = weight;
        t.rng = rng;
        Skips left;
        return run(t, &left);
      });
  if (out.defined()) {
    ++graphed_forwards_;
  } else if (!shape_said_) {
    shape_said_ = true;
    log::warning(detail::concat("stage ", index_, ": pipeline.cuda_graphs: micro-batch ", m, " of shape ",
                                s.input.sizes(), " differs from its capture; micro-batches of another shape than "
                                "their first run eagerly"));
  }
  return out;
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
    s.skips_in = as_leaves(s.skips_in);
    s.output = run(s, &s.skips_out);
    last_recompute_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return s;
}

bool Stage::passes_through(const Saved& s, const std::string& name) {
  auto in = s.skips_in.find(name), out = s.skips_out.find(name);
  return in != s.skips_in.end() && out != s.skips_out.end() &&
         in->second.unsafeGetTensorImpl() == out->second.unsafeGetTensorImpl();
}

void Stage::backward_roots(const Saved& s, const at::Tensor& grad_output, const Skips& skip_grads,
                           std::vector<at::Tensor>& roots, std::vector<at::Tensor>& grads) const {
  if (s.output.requires_grad()) {
    PIPETRAIN_CHECK(is_last() || grad_output.defined(), "stage ", index_, " needs an output gradient");
    roots.push_back(s.output);
    grads.push_back(is_last() ? torch::ones_like(s.output) : grad_output);
  }
  for (const auto& [name, t] : s.skips_out) {
    if (passes_through(s, name) || !t.requires_grad()) continue;
    auto g = skip_grads.find(name);
    PIPETRAIN_CHECK(g != skip_grads.end() && g->second.defined(), "stage ", index_, " needs the gradient of skip '",
                    name, "' for micro-batch backward");
    roots.push_back(t);
    grads.push_back(g->second);
  }
}

void Stage::skip_grads_of(const Saved& s, const Skips& skip_grads, const std::map<std::string, at::Tensor>& computed,
                          Skips* out) const {
  if (!out) return;
  out->clear();
  for (const auto& [name, leaf] : s.skips_in) {
    if (!leaf.is_floating_point()) continue;
    const Skips& from = passes_through(s, name) ? skip_grads : computed;
    auto g = from.find(name);
    (*out)[name] = g != from.end() && g->second.defined() ? g->second : torch::zeros_like(leaf);
  }
}

at::Tensor Stage::backward(int m, const at::Tensor& grad_output, const Skips& skip_grads, Skips* skip_grads_in) {
  Saved s = take(m);
  std::vector<at::Tensor> roots, grads;
  backward_roots(s, grad_output, skip_grads, roots, grads);
  if (!roots.empty()) torch::autograd::backward(roots, grads);
  std::map<std::string, at::Tensor> computed;
  for (const auto& [name, leaf] : s.skips_in)
    if (leaf.requires_grad()) computed[name] = leaf.grad();
  skip_grads_of(s, skip_grads, computed, skip_grads_in);
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
  // The whole backward, when no input of the stage needs a gradient: its roots and their gradients.
  std::vector<at::Tensor> outputs, grad_outputs;
};

Stage::~Stage() = default;

at::Tensor Stage::backward_input(int m, const at::Tensor& grad_output, const Skips& skip_grads, Skips* skip_grads_in) {
  PIPETRAIN_CHECK(!weight_work_.count(m), "stage ", index_, " ran backward_input twice for micro-batch ", m);
  Saved s = take(m);
  auto work = std::make_unique<WeightWork>();
  std::vector<at::Tensor> roots, root_grads;
  backward_roots(s, grad_output, skip_grads, roots, root_grads);
  // What needs a gradient here: the input (not on the first stage) and the skips the layers used.
  std::vector<std::string> input_names;
  std::vector<at::Tensor> inputs;
  if (!is_first() && s.input.requires_grad()) input_names.push_back(""), inputs.push_back(s.input);
  for (const auto& [name, leaf] : s.skips_in)
    if (leaf.requires_grad() && !passes_through(s, name)) input_names.push_back(name), inputs.push_back(leaf);
  std::map<std::string, at::Tensor> computed;  // by input name ("" the stage input)
  if (!roots.empty() && inputs.empty()) {
    work->outputs = roots;
    work->grad_outputs = root_grads;
  } else if (!roots.empty()) {
    namespace impl = torch::autograd::impl;
    std::vector<Edge> root_edges, input_edges;
    for (const auto& r : roots) root_edges.push_back(impl::gradient_edge(r));
    std::unordered_set<Node*> input_nodes;
    for (const auto& t : inputs) {
      input_edges.push_back(impl::gradient_edge(t));
      input_nodes.insert(input_edges.back().function.get());
    }
    std::unordered_set<Node*> param_nodes;
    for (const auto& p : layers_->parameters())
      if (auto acc = impl::try_get_grad_accumulator(p)) param_nodes.insert(acc.get());

    // Which nodes reach an input and which reach a parameter (iterative post-order walk).
    std::unordered_map<Node*, std::pair<bool, bool>> reach;  // node -> (input, parameter)
    std::vector<std::pair<Node*, bool>> stack;
    for (const Edge& r : root_edges) stack.push_back({r.function.get(), false});
    std::vector<Node*> order;
    while (!stack.empty()) {
      auto [n, expanded] = stack.back();
      stack.pop_back();
      if (expanded) {
        bool in = false, par = false;
        for (const Edge& e : n->next_edges()) {
          Node* c = e.function.get();
          if (!c) continue;
          in |= input_nodes.count(c) > 0 || reach[c].first;
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
    bool any_input = false;
    for (const Edge& r : root_edges) any_input |= input_nodes.count(r.function.get()) > 0 || reach[r.function.get()].first;

    if (!any_input) {
      // The outputs do not depend on the inputs through differentiable ops: the input gradients
      // are zero and the whole backward is weight work.
      work->outputs = roots;
      work->grad_outputs = root_grads;
    } else {
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

      auto& engine = torch::autograd::Engine::get_default_engine();
      variable_list out = engine.execute(root_edges, root_grads, /*keep_graph=*/true, /*create_graph=*/false,
                                         /*accumulate_grad=*/false, input_edges);
      for (size_t i = 0; i < input_names.size(); ++i) computed[input_names[i]] = out.at(i);

      // Detach the intermediates from the input path: W must not push gradients down it again,
      // and the rest of the graph (activations only B needed) is released with `s`.
      for (auto& [n, hook] : hooks) {
        auto& pre = n->pre_hooks();
        pre.erase(std::remove_if(pre.begin(), pre.end(), [h = hook](const auto& p) { return p.get() == h; }),
                  pre.end());
        for (Edge& e : n->next_edges()) {
          Node* c = e.function.get();
          if (c && (input_nodes.count(c) || reach[c].first)) e = Edge();
        }
      }
    }
  }
  weight_work_.emplace(m, std::move(work));
  skip_grads_of(s, skip_grads, computed, skip_grads_in);
  if (is_first() || !s.input.requires_grad()) return {};
  auto g = computed.find("");
  return g != computed.end() && g->second.defined() ? g->second : torch::zeros_like(s.input);
}

void Stage::backward_weight(int m) {
  auto it = weight_work_.find(m);
  PIPETRAIN_CHECK(it != weight_work_.end(), "stage ", index_,
                  " backward_weight for micro-batch ", m, " without its backward_input");
  std::unique_ptr<WeightWork> work = std::move(it->second);
  weight_work_.erase(it);
  if (!work->outputs.empty()) {
    torch::autograd::backward(work->outputs, work->grad_outputs);
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
