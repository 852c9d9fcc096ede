// Pipeline (pipeline.h): data parallelism, the engine's side of it. The copies of an in-process
// pipeline, the gradient reducers of each virtual stage (pipeline/replicas.h), the BatchNorm
// statistics merged over the copies, and the calls that every copy makes together.
#include <map>

#include <torch/torch.h>

#include "common/error.h"
#include "models/layers.h"
#include "pipeline/impl.h"
#include "pipeline/optimizer_state.h"

namespace pipetrain::pipeline {

namespace {
std::string list(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

}  // namespace

void Pipeline::Impl::make_replicas(const torch::nn::Sequential& model, const stages::LossFn& loss) {
  auto groups = comm::make_local_gloo_groups(options.stages, mesh.data_parallel, options.timeout_s);
  device_groups.clear();
  for (int r = 0; r < options.stages; ++r) device_groups.push_back(groups[r][0]);
  PipelineOptions o = options;
  o.balance = balance;
  for (int d = 1; d < mesh.data_parallel; ++d) {
    auto impl = std::make_unique<Impl>();
    impl->copy = d;
    for (int r = 0; r < options.stages; ++r) impl->device_groups.push_back(groups[r][d]);
    auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());
    if (!copy) throw Error("pipeline: cannot copy the model for data parallelism");
    std::unique_ptr<comm::Transport> none;
    impl->init(torch::nn::Sequential(copy), o, loss, none);
    others.push_back(std::unique_ptr<Pipeline>(new Pipeline(std::move(impl))));
    drivers.push_back(std::make_unique<Worker>(detail::concat("copy ", d), options.intra_op_threads));
  }
}

void Pipeline::Impl::make_reducers() {
  reducers.clear();
  reducers.resize(stages.size());
  for (int vs = 0; vs < static_cast<int>(stages.size()); ++vs) {
    if (!runs(vs)) continue;
    auto params = stages[vs]->layers()->parameters();
    if (params.empty()) continue;
    const int device = sched.device_of(vs);
    ReplicaInfo info;
    info.data_parallel = mesh.data_parallel;
    info.copy = copy;
    info.name = detail::concat("stage ", device, sched.chunks > 1 ? detail::concat(" chunk ", sched.chunk_of(vs)) : "",
                               "'s gradient reduction across its ", mesh.data_parallel, " copies");
    std::vector<int> others_here;
    for (int c = 0; c < mesh.data_parallel; ++c)
      if (c != copy) others_here.push_back(self >= 0 ? mesh.rank(device, c) : c);
    const bool ranks = self >= 0;
    info.others = others_here.size() == 1 ? detail::concat(ranks ? "rank " : "copy ", others_here[0])
                                          : detail::concat("one of ", ranks ? "ranks " : "copies ", list(others_here));
    if (self >= 0 && others_here.size() == 1) info.peer = others_here[0];
    using SR = PipelineOptions::ShardReduction;
    const auto& group = device_groups.at(device);
    const bool scatter = options.shard_reduction == SR::Auto ? group->getBackendName() != "gloo"
                                                             : options.shard_reduction == SR::ReduceScatter;
    reducers[vs] = std::make_unique<GradientReducer>(group, info, std::move(params), options.shard_optimizer,
                                                     options.bucket_bytes, scatter);
  }
}

void Pipeline::Impl::reduce_now() {
  if (grads_reduced) return;
  const auto error = fork_join(workers, local, [this](int r) {
    for (int c = 0; c < sched.chunks; ++c)
      if (auto& reducer = reducers[sched.virtual_stage(r, c)]) {
        reducer->start();
        reducer->finish(Deadline::after(options.timeout_s));
      }
  });
  if (error) {
    if (self >= 0) fail("the gradient reduction failed", error);
    std::rethrow_exception(error);
  }
  grads_reduced = true;
}

// Chan, Golub and LeVeque's merge of (count, mean, squared deviations), copy by copy in order,
// as BatchNormImpl merges micro-batches: the running statistics then follow the whole batch.
void Pipeline::Impl::merge_batch_norm() {
  for (int r : local)
    for (int c = 0; c < sched.chunks; ++c) {
      const int vs = sched.virtual_stage(r, c);
      for (models::BatchNormImpl* bn : models::batch_norms(*stages[vs]->layers())) {
        auto [count, mean, m2] = bn->accumulated();
        const int64_t F = bn->running_mean.numel();
        at::Tensor mine = torch::zeros({1 + 2 * F}, torch::kDouble);
        mine[0] = static_cast<double>(count);
        if (count > 0) {
          mine.narrow(0, 1, F).copy_(mean.reshape({-1}));
          mine.narrow(0, 1 + F, F).copy_(m2.reshape({-1}));
        }
        at::Tensor all = torch::empty({mesh.data_parallel * (1 + 2 * F)}, torch::kDouble);
        try {
          comm::wait_work(comm::all_gather(*device_groups.at(r), all, mine), Deadline::after(options.timeout_s));
        } catch (const std::exception& e) {
          throw TransportError(-1, detail::concat("stage ", r, ": merging BatchNorm statistics across the copies: ", e.what()));
        }
        int64_t n = 0;
        at::Tensor mu, dev;
        for (int d = 0; d < mesh.data_parallel; ++d) {
          at::Tensor part = all.narrow(0, d * (1 + 2 * F), 1 + 2 * F);
          const int64_t k = static_cast<int64_t>(part[0].item<double>());
          if (k == 0) continue;
          at::Tensor pm = part.narrow(0, 1, F), pd = part.narrow(0, 1 + F, F);
          if (n == 0) {
            mu = pm.clone();
            dev = pd.clone();
          } else {
            const double a = static_cast<double>(n), b = static_cast<double>(k);
            at::Tensor delta = pm - mu;
            mu = mu + delta * (b / (a + b));
            dev = dev + pd + delta * delta * (a * b / (a + b));
          }
          n += k;
        }
        if (n > 0) bn->set_accumulated(n, mu.view_as(mean.defined() ? mean : mu), dev.view_as(m2.defined() ? m2 : dev));
      }
    }
}

// A copy that failed a reduction may have been waiting for a rank stuck elsewhere, whose name
// reaches this rank as the abort notice of the rank that noticed it: wait briefly for one (a
// receive that no message matches ends at once when the endpoint has been aborted).
std::string Pipeline::Impl::abort_notice(int r) {
  if (self < 0) return "";
  const int world = mesh.world(), me = peer(self);
  try {
    transports[r]->recv((me + 1) % world, {comm::Kind::Control, -1, 0xfff, step, "an abort notice"},
                        Deadline::after(std::min(2.0, options.timeout_s / 4)));
  } catch (const TimeoutError&) {
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

void Pipeline::Impl::on_every_copy(const std::function<void(Impl&)>& f) {
  std::vector<int> copies(others.size());
  for (size_t i = 0; i < others.size(); ++i) copies[i] = static_cast<int>(i);
  if (auto error = fork_join(drivers, copies, [&](int i) { f(*others[i]->impl_); }, [&] { f(*this); }))
    std::rethrow_exception(error);
}

double Pipeline::Impl::run(const at::Tensor& input, const at::Tensor& target, bool apply_optimizer, bool accumulate,
                           double scale) {
  if (others.empty()) return run_step(input, target, apply_optimizer, accumulate, scale);
  std::vector<double> part(others.size() + 1, 0.0);
  on_every_copy([&](Impl& p) { part[p.copy] = p.run_step(input, target, apply_optimizer, accumulate, scale); });
  double loss = 0;
  for (double l : part) loss += l;
  return loss;
}

void Pipeline::sync_gradients(bool on) {
  impl_->on_every_copy([on](Impl& p) { p.sync = on; });
}
int Pipeline::data_parallel() const { return impl_->mesh.data_parallel; }
int Pipeline::copy() const { return impl_->copy; }

void Pipeline::sync_copies() {
  Impl& first = *impl_;
  for (auto& r : first.reducers)
    if (r && r->sharded()) r->refresh_shard();
  for (auto& other : first.others) {
    Impl& p = *other->impl_;
    torch::NoGradGuard no_grad;
    for (size_t vs = 0; vs < first.stages.size(); ++vs) {
      auto& from = first.stages[vs]->layers();
      auto& to = p.stages[vs]->layers();
      auto fp = from->parameters(), tp = to->parameters();
      auto fb = from->buffers(), tb = to->buffers();
      for (size_t i = 0; i < fp.size(); ++i) tp[i].copy_(fp[i]);
      for (size_t i = 0; i < fb.size(); ++i) tb[i].copy_(fb[i]);
      if (p.sharded() && p.reducers[vs]) p.reducers[vs]->refresh_shard();
      auto* fo = first.optimizers[vs].get();
      auto* to_opt = p.optimizers[vs].get();
      if (!fo || !to_opt || first.sharded()) continue;
      to_opt->state().clear();
      for (size_t i = 0; i < fp.size(); ++i) {
        auto it = fo->state().find(fp[i].unsafeGetTensorImpl());
        if (it != fo->state().end()) to_opt->state()[tp[i].unsafeGetTensorImpl()] = deep_copy(*it->second);
      }
    }
  }
}

}  // namespace pipetrain::pipeline

namespace pipetrain::pipeline {

std::unique_ptr<torch::optim::Optimizer> Pipeline::Impl::gather_optimizer(int vs) {
  GradientReducer& reducer = *reducers.at(vs);
  auto full = factory(reducer.parameters());
  torch::optim::Optimizer* shard = optimizers.at(vs).get();
  if (!shard) return full;
  auto it = shard->state().find(reducer.shard().unsafeGetTensorImpl());
  if (it == shard->state().end()) return full;  // no step yet: no state on any copy
  const ParamState sliced = to_param_state(*it->second);  // optimizer_state.h
  std::vector<ParamState> per_param(reducer.parameters().size(), ParamState{sliced.kind, sliced.step, {}});
  for (const auto& [name, slice] : sliced.tensors) {
    const auto parts = reducer.gather_state(slice, Deadline::after(options.timeout_s));
    for (size_t i = 0; i < parts.size(); ++i) per_param[i].tensors[name] = parts[i];
  }
  for (size_t i = 0; i < per_param.size(); ++i)
    if (auto state = make_param_state(per_param[i])) full->state()[reducer.parameters()[i].unsafeGetTensorImpl()] = std::move(state);
  return full;
}

std::unique_ptr<torch::optim::Optimizer> Pipeline::gathered_optimizer(int virtual_stage) {
  if (!sharded_optimizer() || !impl_->reducers.at(virtual_stage)) return nullptr;
  std::unique_ptr<torch::optim::Optimizer> first;
  impl_->on_every_copy([&](Impl& p) {
    auto full = p.gather_optimizer(virtual_stage);
    if (p.copy == impl_->copy) first = std::move(full);
  });
  return first;
}

std::unique_ptr<torch::optim::Optimizer> Pipeline::unsharded_optimizer(int virtual_stage) {
  if (!sharded_optimizer() || !impl_->reducers.at(virtual_stage) || !impl_->factory) return nullptr;
  return impl_->factory(impl_->reducers[virtual_stage]->parameters());
}

void Pipeline::scatter_optimizer(int virtual_stage, torch::optim::Optimizer& full) {
  std::vector<Impl*> copies{impl_.get()};
  for (auto& o : impl_->others) copies.push_back(o->impl_.get());
  const auto& params = impl_->reducers.at(virtual_stage)->parameters();
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
  for (Impl* p : copies) {
    GradientReducer& reducer = *p->reducers.at(virtual_stage);
    torch::optim::Optimizer* shard = p->optimizers.at(virtual_stage).get();
    if (!shard) continue;
    shard->state().clear();
    if (!kind) continue;
    ParamState slices = *kind;
    for (const auto& [name, parts] : fields)
      if (parts.size() == params.size()) slices.tensors[name] = reducer.slice_of(parts);
    if (auto state = make_param_state(slices)) shard->state()[reducer.shard().unsafeGetTensorImpl()] = std::move(state);
  }
}

bool Pipeline::sharded_optimizer() const { return impl_->sharded(); }

}  // namespace pipetrain::pipeline
