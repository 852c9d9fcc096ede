// Pipeline (pipeline.h): data parallelism, the engine's side of it. The copies of an in-process
// pipeline, the gradient reducers of each virtual stage (pipeline/replicas.h), the BatchNorm
// statistics merged over the copies, and the calls that every copy makes together.
#include <map>

#include <torch/torch.h>

#include "common/error.h"
#include "models/layers.h"
#include "pipeline/executor.h"
#include "pipeline/optimizer_state.h"

namespace pipetrain::pipeline {

namespace {
std::string list(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

}  // namespace

void Executor::make_replicas(const torch::nn::Sequential& model, const stages::LossFn& loss) {
  auto groups = comm::make_local_gloo_groups(options.stages, mesh.data_parallel, options.timeout_s);
  device_groups.clear();
  for (int r = 0; r < options.stages; ++r) device_groups.push_back(groups[r][0]);
  PipelineOptions o = options;
  o.balance = balance;
  for (int d = 1; d < mesh.data_parallel; ++d) {
    auto other = std::make_unique<Executor>();
    other->copy = d;
    for (int r = 0; r < options.stages; ++r) other->device_groups.push_back(groups[r][d]);
    auto layers = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());
    if (!layers) throw Error("pipeline: cannot copy the model for data parallelism");
    std::unique_ptr<comm::Transport> none;
    other->init(torch::nn::Sequential(layers), o, loss, none);
    others.push_back(std::move(other));
    drivers.push_back(std::make_unique<Worker>(detail::concat("copy ", d), options.intra_op_threads));
  }
}

void Executor::make_reducers() {
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

void Executor::reduce_now() {
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
void Executor::merge_batch_norm() {
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
std::string Executor::abort_notice(int r) {
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

void Executor::on_every_copy(const std::function<void(Executor&)>& f) {
  std::vector<int> copies(others.size());
  for (size_t i = 0; i < others.size(); ++i) copies[i] = static_cast<int>(i);
  if (auto error = fork_join(drivers, copies, [&](int i) { f(*others[i]); }, [&] { f(*this); }))
    std::rethrow_exception(error);
}

double Executor::run(const at::Tensor& input, const at::Tensor& target, bool apply_optimizer, bool accumulate,
                           double scale) {
  if (others.empty()) return run_step(input, target, apply_optimizer, accumulate, scale);
  std::vector<double> part(others.size() + 1, 0.0);
  on_every_copy([&](Executor& p) { part[p.copy] = p.run_step(input, target, apply_optimizer, accumulate, scale); });
  double loss = 0;
  for (double l : part) loss += l;
  return loss;
}

void Executor::sync_copies() {
  Executor& first = *this;
  for (auto& r : first.reducers)
    if (r && r->sharded()) r->refresh_shard();
  for (auto& other : first.others) {
    Executor& p = *other;
    torch::NoGradGuard no_grad;
    for (size_t vs = 0; vs < first.stages.size(); ++vs) {
      auto& from = first.stages[vs]->layers();
      auto& to = p.stages[vs]->layers();
      auto fp = from->parameters(), tp = to->parameters();
      auto fb = from->buffers(), tb = to->buffers();
      for (size_t i = 0; i < fp.size(); ++i) tp[i].copy_(fp[i]);
      for (size_t i = 0; i < fb.size(); ++i) tb[i].copy_(fb[i]);
      if (p.sharded() && p.reducers[vs]) p.reducers[vs]->refresh_shard();
      auto* fo = first.opt.optimizers[vs].get();
      auto* to_opt = p.opt.optimizers[vs].get();
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
