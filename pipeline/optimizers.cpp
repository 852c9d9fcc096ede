// The optimizer side of a Pipeline (optimizers.h): each copy's stage optimizers stepped on its
// runners' workers (the executor's OptimizerSide, executor.h), the gradient norm, clipping and
// the non-finite check, fp16 loss scaling, and a sharded optimizer's state gathered and
// scattered through the codec of optimizer_state.h; StageOptimizers runs them on every copy.
#include "pipeline/optimizers.h"

#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include <torch/torch.h>

#include "common/error.h"
#include "pipeline/copies.h"
#include "pipeline/optimizer_state.h"
#include "models/model.h"

namespace pipetrain::pipeline {

void Executor::step_device_optimizers(int r, Clock::time_point t0, double grad_scale) {
  const double start = seconds_since(t0);
  for (int c = 0; c < sched_.chunks; ++c) {
    const int vs = sched_.virtual_stage(r, c);
    GradientReducer* reducer = sharded() ? dp_.reducers[vs].get() : nullptr;  // ZeRO-1's slice
    if (grad_scale != 1.0) {
      torch::NoGradGuard no_grad;
      for (auto& p : reducer ? std::vector<at::Tensor>{reducer->shard()} : stages_[vs]->layers()->parameters())
        if (p.grad().defined()) p.mutable_grad().mul_(grad_scale);
    }
    if (auto& o = opt_.optimizers[vs]) o->step();
    // ZeRO-1: every copy's updated slice into every copy's parameters.
    if (reducer) reducer->gather_parameters(Deadline::after(options_.timeout_s));
  }
  trace_.optimizer[r] = {start, seconds_since(t0)};
}

double Executor::device_grad_sq_norm(int r) const {
  double sum = 0;
  for (int c = 0; c < sched_.chunks; ++c) {
    const int vs = sched_.virtual_stage(r, c);
    if (sharded() && dp_.reducers[vs]) {  // summed across the copies' slices
      sum += dp_.reducers[vs]->grad_sq_norm(Deadline::after(options_.timeout_s));
      continue;
    }
    // Each parameter's norm on its device, read back together (one host synchronization per
    // chunk, not one per parameter), then summed in parameter order as before.
    std::vector<at::Tensor> norms;
    for (const auto& p : stages_[vs]->layers()->parameters())
      if (p.grad().defined() && !ties_.follower(p))  // a tied weight counts once
        norms.push_back(p.grad().norm().reshape({}).to(at::kDouble));  // NaN and inf carry through
    if (norms.empty()) continue;
    const at::Tensor all = at::stack(norms).cpu();
    const double* n = all.data_ptr<double>();
    for (int64_t i = 0; i < all.numel(); ++i) sum += n[i] * n[i];
  }
  return sum;
}

double Executor::step_all(Clock::time_point t0) {
  double scale = 1.0, norm = 0;
  check_usable();
  opt_.skipped = false;
  reduce_now();
  if (!sharded()) sum_ties();  // sharded: summed before the reduction (reduce_now)
  // Multi-process: always, so that the ranks' exchanges match whatever each tracks locally.
  // fp16: always, as the overflow check.
  if (self_ >= 0 || opt_.grad_clip > 0 || opt_.track_norm || opt_.check_finite || scaling()) {
    std::vector<double> sq(options_.stages, 0.0);
    if (auto error = on_local_devices([&](DeviceRunner& d) { sq[d.device()] = device_grad_sq_norm(d.device()); }))
      std::rethrow_exception(error);
    if (self_ >= 0) {  // every rank sums every rank's squares in the same order (its own copy's)
      const auto all = group_.all_gather(torch::tensor({sq[self_]}, torch::kDouble), "the gradient norms");
      for (int r = 0; r < options_.stages; ++r) sq[r] = all[peer(r)].item<double>();
    }
    // fp16: an overflow anywhere skips the step on every stage (all ranks saw the same squares).
    if (scaling() && !opt_.scaler.unscale(sq, scale)) {
      opt_.skipped = true;
      return std::numeric_limits<double>::infinity();
    }
    for (int r = 0; r < options_.stages; ++r)
      if (opt_.check_finite && !std::isfinite(sq[r]))
        throw NonFiniteGradient(r, detail::concat("stage ", r, ": the gradient is not finite (squared norm ", sq[r],
                                                  "); no parameter was changed"));
    for (double v : sq) norm += v;
    norm = std::sqrt(norm);
    if (opt_.grad_clip > 0 && norm > opt_.grad_clip) scale *= opt_.grad_clip / (norm + 1e-6);
  }
  if (auto error = on_local_devices([&](DeviceRunner& d) { step_device_optimizers(d.device(), t0, scale); })) {
    if (self_ >= 0) fail("optimizer step failed", error);
    std::rethrow_exception(error);
  }
  share_tied_values();
  return norm;
}

// Sharded, three copies or more: the members of each tie made equal to its first again (Ties::
// copy_values says why; with two copies each element's sum has one order, a + b = b + a).
void Executor::share_tied_values() {
  if (!sharded() || ties_.empty() || dp_.mesh.data_parallel < 3) return;
  if (self_ < 0) {
    ties_.copy_values();
    return;
  }
  const auto rank_of = [this](int vs) { return peer(sched_.device_of(vs)); };
  if (auto error = on_local_devices([&](DeviceRunner& d) {
        ties_.exchange_values(d.endpoint(), d.context(), rank_of, io_.step, options_.timeout_s);
      }))
    fail("the tied parameters' exchange after the step failed", error);
}

double Executor::step_optimizers() {
  opt_.grad_norm = step_all(step_t0_);
  trace_.wall = seconds_since(step_t0_);
  return opt_.grad_norm;
}

void Executor::set_optimizers(const OptimizerFactory& factory) {
  opt_.factory = factory;
  for (size_t vs = 0; vs < stages_.size(); ++vs) {
    auto params = models::trainable_parameters(*stages_[vs]->layers());
    if (params.empty() || !runs(static_cast<int>(vs)))
      opt_.optimizers[vs] = nullptr;
    else
      opt_.optimizers[vs] = sharded() ? factory({dp_.reducers[vs]->shard()}) : factory(params);
  }
}

std::unique_ptr<torch::optim::Optimizer> Executor::gathered_optimizer(int vs) {
  GradientReducer& reducer = *dp_.reducers.at(vs);
  auto full = opt_.factory(reducer.parameters());
  torch::optim::Optimizer* shard = opt_.optimizers.at(vs).get();
  if (!shard) return full;
  auto it = shard->state().find(reducer.shard().unsafeGetTensorImpl());
  if (it == shard->state().end()) return full;  // no step yet: no state on any copy
  const ParamState sliced = to_param_state(*it->second);  // optimizer_state.h
  std::vector<ParamState> per_param(reducer.parameters().size(), ParamState{sliced.kind, sliced.step, {}});
  for (const auto& [name, slice] : sliced.tensors) {
    const auto parts = reducer.gather_state(slice, Deadline::after(options_.timeout_s));
    for (size_t i = 0; i < parts.size(); ++i) per_param[i].tensors[name] = parts[i];
  }
  for (size_t i = 0; i < per_param.size(); ++i)
    if (auto state = make_param_state(per_param[i])) full->state()[reducer.parameters()[i].unsafeGetTensorImpl()] = std::move(state);
  return full;
}

void StageOptimizers::set(OptimizerFactory factory) {
  copies_.each([&factory](Executor& e) { e.set_optimizers(factory); });
}

double StageOptimizers::step() {
  copies_.each([](Executor& e) { e.step_optimizers(); });
  return copies_.front().optimizer_side().grad_norm;
}

void StageOptimizers::set_grad_clip(double max_norm) {
  if (!(max_norm >= 0) || !std::isfinite(max_norm))
    throw ConfigError(detail::concat("pipeline: gradient clip must be a finite number >= 0, got ", max_norm));
  copies_.each([max_norm](Executor& e) { e.optimizer_side().grad_clip = max_norm; });
}

void StageOptimizers::set_learning_rate(double lr) {
  copies_.each([lr](Executor& e) {
    for (auto& o : e.optimizer_side().optimizers)
      if (o)
        for (auto& group : o->param_groups()) group.options().set_lr(lr);
  });
}

double StageOptimizers::last_grad_norm() const { return side().grad_norm; }
double StageOptimizers::loss_scale() const { return copies_.front().scaling() ? side().scaler.scale() : 1.0; }
int64_t StageOptimizers::loss_scale_good_steps() const {
  return copies_.front().scaling() ? side().scaler.good_steps() : 0;
}
bool StageOptimizers::last_step_skipped() const { return side().skipped; }
void StageOptimizers::restore_loss_scale(double scale, int64_t good_steps) {
  copies_.each([=](Executor& e) {
    if (e.scaling()) e.optimizer_side().scaler.restore(scale, good_steps);
  });
}
void StageOptimizers::track_grad_norm(bool on) {
  copies_.each([on](Executor& e) { e.optimizer_side().track_norm = on; });
}
void StageOptimizers::check_finite_grads(bool on) {
  copies_.each([on](Executor& e) { e.optimizer_side().check_finite = on; });
}
torch::optim::Optimizer* StageOptimizers::of(int virtual_stage) {
  return copies_.front().optimizer_side().optimizers.at(virtual_stage).get();
}

std::unique_ptr<torch::optim::Optimizer> StageOptimizers::gathered(int virtual_stage) {
  if (!sharded() || !copies_.front().reducer(virtual_stage)) return nullptr;
  std::unique_ptr<torch::optim::Optimizer> first;
  const int front = copies_.front().copy();
  copies_.each([&](Executor& e) {
    auto full = e.gathered_optimizer(virtual_stage);
    if (e.copy() == front) first = std::move(full);
  });
  return first;
}

std::unique_ptr<torch::optim::Optimizer> StageOptimizers::unsharded(int virtual_stage) {
  Executor& e = copies_.front();
  if (!sharded() || !e.reducer(virtual_stage) || !e.optimizer_side().factory) return nullptr;
  return e.optimizer_side().factory(e.reducer(virtual_stage)->parameters());
}

void StageOptimizers::scatter(int virtual_stage, torch::optim::Optimizer& full) {
  const auto& params = copies_.front().reducer(virtual_stage)->parameters();
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
  for (Executor* e : copies_.all()) {
    GradientReducer& reducer = *e->reducer(virtual_stage);
    torch::optim::Optimizer* shard = e->optimizer_side().optimizers.at(virtual_stage).get();
    if (!shard) continue;
    shard->state().clear();
    if (!kind) continue;
    ParamState slices = *kind;
    for (const auto& [name, parts] : fields)
      if (parts.size() == params.size()) slices.tensors[name] = reducer.slice_of(parts);
    if (auto state = make_param_state(slices)) shard->state()[reducer.shard().unsafeGetTensorImpl()] = std::move(state);
  }
}

bool StageOptimizers::sharded() const { return copies_.front().sharded(); }

void StageOptimizers::gather_grads() {
  if (!sharded()) return;
  copies_.each([](Executor& e) {
    e.reduce_now();  // what was left for the optimizer step (the ties' stages, say)
    for (int vs = 0; vs < static_cast<int>(e.balance().size()); ++vs) {
      GradientReducer* reducer = e.reducer(vs);
      if (!reducer || !reducer->shard().grad().defined()) continue;
      const auto whole = reducer->gather_state(reducer->shard().grad(), Deadline::after(e.options().timeout_s));
      for (size_t i = 0; i < whole.size(); ++i) reducer->parameters()[i].mutable_grad() = whole[i];
    }
  });
}

const OptimizerSide& StageOptimizers::side() const { return copies_.front().optimizer_side(); }

}  // namespace pipetrain::pipeline
