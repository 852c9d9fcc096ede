// The optimizer side of a Pipeline (optimizers.h): the stage optimizers' steps on the executor's
// workers, the gradient norm, clipping and the non-finite check, fp16 loss scaling, and a
// sharded optimizer's state gathered and scattered through the codec of optimizer_state.h.
#include "pipeline/optimizers.h"

#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include <torch/torch.h>

#include "common/error.h"
#include "pipeline/executor.h"
#include "pipeline/optimizer_state.h"

namespace pipetrain::pipeline {

namespace {

void step_stage_optimizers(Executor& e, int r, Clock::time_point t0, double grad_scale) {
  const double start = seconds_since(t0);
  for (int c = 0; c < e.sched.chunks; ++c) {
    const int vs = e.sched.virtual_stage(r, c);
    stages::Stage& st = *e.stages[vs];
    if (grad_scale != 1.0) {
      torch::NoGradGuard no_grad;
      for (auto& p : e.sharded() && e.reducers[vs] ? std::vector<at::Tensor>{e.reducers[vs]->shard()} : st.layers()->parameters())
        if (p.grad().defined()) p.mutable_grad().mul_(grad_scale);
    }
    if (auto& o = e.opt.optimizers[vs]) o->step();
    // ZeRO-1: every copy's updated slice into every copy's parameters.
    if (e.sharded() && e.reducers[vs]) e.reducers[vs]->gather_parameters(Deadline::after(e.options.timeout_s));
  }
  e.trace.optimizer[r] = {start, seconds_since(t0)};
}

double stage_grad_sq_norm(const Executor& e, int r) {
  double sum = 0;
  for (int c = 0; c < e.sched.chunks; ++c)
    if (e.sharded() && e.reducers[e.sched.virtual_stage(r, c)])  // summed across the copies' slices
      sum += e.reducers[e.sched.virtual_stage(r, c)]->grad_sq_norm(Deadline::after(e.options.timeout_s));
    else {
      // Each parameter's norm on its device, read back together (one host synchronization per
      // chunk, not one per parameter), then summed in parameter order as before.
      std::vector<at::Tensor> norms;
      for (const auto& p : e.stages[e.sched.virtual_stage(r, c)]->layers()->parameters())
        if (p.grad().defined() && !e.tie_followers.count(p.unsafeGetTensorImpl()))  // a tied weight counts once
          norms.push_back(p.grad().norm().reshape({}).to(at::kDouble));  // NaN and inf carry through
      if (norms.empty()) continue;
      const at::Tensor all = at::stack(norms).cpu();
      const double* n = all.data_ptr<double>();
      for (int64_t i = 0; i < all.numel(); ++i) sum += n[i] * n[i];
    }
  return sum;
}

}  // namespace

double step_all(Executor& e, Clock::time_point t0) {
  double scale = 1.0, norm = 0;
  e.check_usable();
  e.opt.skipped = false;
  e.reduce_now();
  e.sum_tied_grads();
  // Multi-process: always, so that the ranks' exchanges match whatever each tracks locally.
  // fp16: always, as the overflow check.
  if (e.self >= 0 || e.opt.grad_clip > 0 || e.opt.track_norm || e.opt.check_finite || e.scaling()) {
    std::vector<double> sq(e.options.stages, 0.0);
    if (auto error = fork_join(e.workers, e.local, [&](int r) { sq[r] = stage_grad_sq_norm(e, r); }))
      std::rethrow_exception(error);
    if (e.self >= 0) {  // every rank sums every rank's squares in the same order (its own copy's)
      const auto all = e.group.all_gather(torch::tensor({sq[e.self]}, torch::kDouble), "the gradient norms");
      for (int r = 0; r < e.options.stages; ++r) sq[r] = all[e.peer(r)].item<double>();
    }
    // fp16: an overflow anywhere skips the step on every stage (all ranks saw the same squares).
    if (e.scaling() && !e.opt.scaler.unscale(sq, scale)) {
      e.opt.skipped = true;
      return std::numeric_limits<double>::infinity();
    }
    for (int r = 0; r < e.options.stages; ++r)
      if (e.opt.check_finite && !std::isfinite(sq[r]))
        throw NonFiniteGradient(r, detail::concat("stage ", r, ": the gradient is not finite (squared norm ", sq[r],
                                                  "); no parameter was changed"));
    for (double v : sq) norm += v;
    norm = std::sqrt(norm);
    if (e.opt.grad_clip > 0 && norm > e.opt.grad_clip) scale *= e.opt.grad_clip / (norm + 1e-6);
  }
  if (auto error = fork_join(e.workers, e.local, [&](int r) { step_stage_optimizers(e, r, t0, scale); })) {
    if (e.self >= 0) e.fail("optimizer step failed", error);
    std::rethrow_exception(error);
  }
  return norm;
}

std::unique_ptr<torch::optim::Optimizer> gather_optimizer(Executor& e, int vs) {
  GradientReducer& reducer = *e.reducers.at(vs);
  auto full = e.opt.factory(reducer.parameters());
  torch::optim::Optimizer* shard = e.opt.optimizers.at(vs).get();
  if (!shard) return full;
  auto it = shard->state().find(reducer.shard().unsafeGetTensorImpl());
  if (it == shard->state().end()) return full;  // no step yet: no state on any copy
  const ParamState sliced = to_param_state(*it->second);  // optimizer_state.h
  std::vector<ParamState> per_param(reducer.parameters().size(), ParamState{sliced.kind, sliced.step, {}});
  for (const auto& [name, slice] : sliced.tensors) {
    const auto parts = reducer.gather_state(slice, Deadline::after(e.options.timeout_s));
    for (size_t i = 0; i < parts.size(); ++i) per_param[i].tensors[name] = parts[i];
  }
  for (size_t i = 0; i < per_param.size(); ++i)
    if (auto state = make_param_state(per_param[i])) full->state()[reducer.parameters()[i].unsafeGetTensorImpl()] = std::move(state);
  return full;
}

void StageOptimizers::set(OptimizerFactory factory) {
  executor_.on_every_copy([&factory](Executor& p) {
    p.opt.factory = factory;
    for (size_t vs = 0; vs < p.stages.size(); ++vs) {
      auto params = p.stages[vs]->layers()->parameters();
      if (params.empty() || !p.runs(static_cast<int>(vs)))
        p.opt.optimizers[vs] = nullptr;
      else
        p.opt.optimizers[vs] = p.sharded() ? factory({p.reducers[vs]->shard()}) : factory(params);
    }
  });
}

double StageOptimizers::step() {
  executor_.on_every_copy([](Executor& p) {
    p.opt.grad_norm = step_all(p, p.step_t0);
    p.trace.wall = seconds_since(p.step_t0);
  });
  return executor_.opt.grad_norm;
}

void StageOptimizers::set_grad_clip(double max_norm) {
  if (!(max_norm >= 0) || !std::isfinite(max_norm))
    throw ConfigError(detail::concat("pipeline: gradient clip must be a finite number >= 0, got ", max_norm));
  executor_.on_every_copy([max_norm](Executor& p) { p.opt.grad_clip = max_norm; });
}

void StageOptimizers::set_learning_rate(double lr) {
  executor_.on_every_copy([lr](Executor& p) {
    for (auto& o : p.opt.optimizers)
      if (o)
        for (auto& group : o->param_groups()) group.options().set_lr(lr);
  });
}

double StageOptimizers::last_grad_norm() const { return executor_.opt.grad_norm; }
double StageOptimizers::loss_scale() const { return executor_.scaling() ? executor_.opt.scaler.scale() : 1.0; }
int64_t StageOptimizers::loss_scale_good_steps() const {
  return executor_.scaling() ? executor_.opt.scaler.good_steps() : 0;
}
bool StageOptimizers::last_step_skipped() const { return executor_.opt.skipped; }
void StageOptimizers::restore_loss_scale(double scale, int64_t good_steps) {
  executor_.on_every_copy([=](Executor& p) {
    if (p.scaling()) p.opt.scaler.restore(scale, good_steps);
  });
}
void StageOptimizers::track_grad_norm(bool on) {
  executor_.on_every_copy([on](Executor& p) { p.opt.track_norm = on; });
}
void StageOptimizers::check_finite_grads(bool on) {
  executor_.on_every_copy([on](Executor& p) { p.opt.check_finite = on; });
}
torch::optim::Optimizer* StageOptimizers::of(int virtual_stage) {
  return executor_.opt.optimizers.at(virtual_stage).get();
}

std::unique_ptr<torch::optim::Optimizer> StageOptimizers::gathered(int virtual_stage) {
  if (!sharded() || !executor_.reducers.at(virtual_stage)) return nullptr;
  std::unique_ptr<torch::optim::Optimizer> first;
  executor_.on_every_copy([&](Executor& p) {
    auto full = gather_optimizer(p, virtual_stage);
    if (p.copy == executor_.copy) first = std::move(full);
  });
  return first;
}

std::unique_ptr<torch::optim::Optimizer> StageOptimizers::unsharded(int virtual_stage) {
  if (!sharded() || !executor_.reducers.at(virtual_stage) || !executor_.opt.factory) return nullptr;
  return executor_.opt.factory(executor_.reducers[virtual_stage]->parameters());
}

void StageOptimizers::scatter(int virtual_stage, torch::optim::Optimizer& full) {
  std::vector<Executor*> copies{&executor_};
  for (auto& o : executor_.others) copies.push_back(o.get());
  const auto& params = executor_.reducers.at(virtual_stage)->parameters();
  // The fields every parameter's state has, in parameter order.
  std::map<std::string, std::vector<at::Tensor>> fields;
  std::optional<ParamState> kind;  // the kind and step of the states, once one is seen
  for (const auto& p : params) {
    auto it = full.state().find(p.unsafeGetTensorImpl());
    if (it == full.state().end()) {
      if (kind) throw Error(detail::concat("pipeline: stage ", virtual_stage, ": optimizer state for some parameters only"));
      continue;
    }
    ParamState s = to_param_state(*it->second);
    for (const auto& [name, t] : s.tensors) fields[name].push_back(t);
    kind = ParamState{s.kind, s.step, {}};
  }
  for (Executor* p : copies) {
    GradientReducer& reducer = *p->reducers.at(virtual_stage);
    torch::optim::Optimizer* shard = p->opt.optimizers.at(virtual_stage).get();
    if (!shard) continue;
    shard->state().clear();
    if (!kind) continue;
    ParamState slices = *kind;
    for (const auto& [name, parts] : fields)
      if (parts.size() == params.size()) slices.tensors[name] = reducer.slice_of(parts);
    if (auto state = make_param_state(slices)) shard->state()[reducer.shard().unsafeGetTensorImpl()] = std::move(state);
  }
}

bool StageOptimizers::sharded() const { return executor_.sharded(); }

void StageOptimizers::gather_grads() {
  if (!sharded()) return;
  executor_.on_every_copy([](Executor& p) {
    for (auto& reducer : p.reducers) {
      if (!reducer || !reducer->shard().grad().defined()) continue;
      const auto whole = reducer->gather_state(reducer->shard().grad(), Deadline::after(p.options.timeout_s));
      for (size_t i = 0; i < whole.size(); ++i) reducer->parameters()[i].mutable_grad() = whole[i];
    }
  });
}

}  // namespace pipetrain::pipeline
