// Pipeline (pipeline.h): data parallelism, one copy's side of it (DataParallel, executor.h):
// the gradient reducers of each virtual stage (pipeline/replicas.h), the reduction of gradients
// left unreduced, the BatchNorm statistics merged over the copies, and a copy's parameters and
// optimizer state taken from the first's (Pipeline::sync_copies; the copies themselves: copies.h).
#include <map>

#include <torch/torch.h>

#include "common/error.h"
#include "models/layers.h"
#include "pipeline/executor.h"
#include "pipeline/optimizer_state.h"
#include "models/model.h"

namespace pipetrain::pipeline {

namespace {
std::string list(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

}  // namespace

void Executor::make_reducers() {
  dp_.reducers.clear();
  dp_.reducers.resize(stages_.size());
  for (int vs = 0; vs < static_cast<int>(stages_.size()); ++vs) {
    if (!runs(vs)) continue;
    auto params = models::trainable_parameters(*stages_[vs]->layers());  // the frozen ones have no gradient
    if (params.empty()) continue;
    const int device = sched_.device_of(vs);
    ReplicaInfo info;
    info.data_parallel = dp_.mesh.data_parallel;
    info.copy = dp_.copy;
    info.name = detail::concat("stage ", device, sched_.chunks > 1 ? detail::concat(" chunk ", sched_.chunk_of(vs)) : "",
                               "'s gradient reduction across its ", dp_.mesh.data_parallel, " copies");
    std::vector<int> others_here;
    for (int c = 0; c < dp_.mesh.data_parallel; ++c)
      if (c != dp_.copy) others_here.push_back(self_ >= 0 ? dp_.mesh.rank(device, c) : c);
    const bool ranks = self_ >= 0;
    info.others = others_here.size() == 1 ? detail::concat(ranks ? "rank " : "copy ", others_here[0])
                                          : detail::concat("one of ", ranks ? "ranks " : "copies ", list(others_here));
    if (self_ >= 0 && others_here.size() == 1) info.peer = others_here[0];
    using SR = PipelineOptions::ShardReduction;
    const auto& group = dp_.device_groups.at(device);
    const bool scatter = options_.shard_reduction == SR::Auto ? group->getBackendName() != "gloo"
                                                              : options_.shard_reduction == SR::ReduceScatter;
    dp_.reducers[vs] = std::make_unique<GradientReducer>(group, info, std::move(params), options_.shard_optimizer,
                                                         options_.bucket_bytes, scatter);
  }
  // A sharded optimizer with ties: a tie's gradients must be summed whole, and the reduction
  // leaves each copy a slice. The sum over the copies of each copy's tie sum is the tie sum of
  // the reduced gradients, so the ties are summed first, within each copy, and the stages that
  // hold a member reduce after it, at the optimizer step (the others still reduce beside the
  // backward). A member after its tie's first is left out of the gradient norm, as unsharded.
  if (!sharded() || ties_.empty()) return;
  for (int vs : ties_.virtual_stages()) {
    GradientReducer* reducer = dp_.reducers.at(vs).get();
    if (!reducer) continue;
    reducer->hold_for_ties();
    std::vector<bool> followers;
    for (const auto& p : reducer->parameters()) followers.push_back(ties_.follower(p));
    reducer->leave_out_of_norm(followers);
  }
}

void Executor::sum_ties() {
  if (self_ < 0) {
    ties_.sum_grads();
    return;
  }
  if (ties_.empty()) return;
  const auto rank_of = [this](int vs) { return peer(sched_.device_of(vs)); };
  if (auto error = on_local_devices([&](DeviceRunner& d) {
        ties_.exchange_grads(d.endpoint(), d.context(), rank_of, io_.step, options_.timeout_s);
      }))
    fail("the tied gradients' exchange failed", error);
}

void Executor::reduce_now() {
  const bool ties_pending = dp_.ties_pending;
  if (ties_pending) {
    dp_.ties_pending = false;
    sum_ties();
  }
  if (dp_.reduced && !ties_pending) return;
  const auto error = on_local_devices([&](DeviceRunner& runner) {
    for (int c = 0; c < sched_.chunks; ++c) {
      auto& reducer = dp_.reducers[sched_.virtual_stage(runner.device(), c)];
      if (reducer && (reducer->held() ? ties_pending : !dp_.reduced)) {
        reducer->start();
        reducer->finish(Deadline::after(options_.timeout_s));
      }
    }
  });
  if (error) {
    if (self_ >= 0) fail("the gradient reduction failed", error);
    std::rethrow_exception(error);
  }
  dp_.reduced = true;
}

// Chan, Golub and LeVeque's merge of (count, mean, squared deviations), copy by copy in order,
// as BatchNormImpl merges micro-batches: the running statistics then follow the whole batch.
// Every BatchNorm of a device (all its chunks) travels in one all-gather: [count, mean, m2] per
// layer, one after another (a collective per layer cost a round trip each, which on a busy CPU
// came to several milliseconds a step for ten layers).
void Executor::merge_batch_norm() {
  for (int r : local_) {
    std::vector<models::BatchNormImpl*> bns;
    for (int c = 0; c < sched_.chunks; ++c)
      for (models::BatchNormImpl* bn : models::batch_norms(*stages_[sched_.virtual_stage(r, c)]->layers()))
        bns.push_back(bn);
    if (bns.empty()) continue;
    int64_t size = 0;
    for (const auto* bn : bns) size += 1 + 2 * bn->running_mean.numel();
    at::Tensor mine = torch::zeros({size}, torch::kDouble);
    int64_t at = 0;
    for (const auto* bn : bns) {
      const auto [count, mean, m2] = bn->accumulated();
      const int64_t F = bn->running_mean.numel();
      mine[at] = static_cast<double>(count);
      if (count > 0) {
        mine.narrow(0, at + 1, F).copy_(mean.reshape({-1}));
        mine.narrow(0, at + 1 + F, F).copy_(m2.reshape({-1}));
      }
      at += 1 + 2 * F;
    }
    const auto& group = dp_.device_groups.at(r);
    const bool on_device = group->getBackendName() == "nccl";  // NCCL gathers device memory only
    at::Tensor send = on_device ? mine.to(bns.front()->running_mean.device()) : mine;
    at::Tensor all = torch::empty({dp_.mesh.data_parallel * size}, send.options());
    try {
      comm::wait_work(comm::all_gather(*group, all, send), Deadline::after(options_.timeout_s));
    } catch (const std::exception& e) {
      throw TransportError(-1, detail::concat("stage ", r, ": merging BatchNorm statistics across the copies: ", e.what()));
    }
    if (on_device) all = all.cpu();
    at = 0;
    for (models::BatchNormImpl* bn : bns) {
      const auto [count, mean, m2] = bn->accumulated();
      const int64_t F = bn->running_mean.numel();
      int64_t n = 0;
      at::Tensor mu, dev;
      for (int d = 0; d < dp_.mesh.data_parallel; ++d) {
        at::Tensor part = all.narrow(0, d * size + at, 1 + 2 * F);
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
      at += 1 + 2 * F;
    }
  }
}

// A copy that failed a reduction may have been waiting for a rank stuck elsewhere, whose name
// reaches this rank as the abort notice of the rank that noticed it: wait briefly for one (a
// receive that no message matches ends at once when the endpoint has been aborted).
std::string Executor::abort_notice(int r) {
  if (self_ < 0) return "";
  const int world = dp_.mesh.world(), me = peer(self_);
  try {
    runners_[r]->endpoint().recv((me + 1) % world, {comm::Kind::Control, -1, 0xfff, io_.step, "an abort notice"},
                                 Deadline::after(std::min(2.0, options_.timeout_s / 4)));
  } catch (const TimeoutError&) {
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

void Executor::refresh_shards() {
  for (auto& r : dp_.reducers)
    if (r && r->sharded()) r->refresh_shard();
}

void Executor::copy_from(const Executor& first) {
  torch::NoGradGuard no_grad;
  for (size_t vs = 0; vs < first.stages_.size(); ++vs) {
    auto& from = first.stages_[vs]->layers();
    auto& to = stages_[vs]->layers();
    auto fp = from->parameters(), tp = to->parameters();
    auto fb = from->buffers(), tb = to->buffers();
    for (size_t i = 0; i < fp.size(); ++i) tp[i].copy_(fp[i]);
    for (size_t i = 0; i < fb.size(); ++i) tb[i].copy_(fb[i]);
    if (sharded() && dp_.reducers[vs]) dp_.reducers[vs]->refresh_shard();
    auto* fo = first.opt_.optimizers[vs].get();
    auto* to_opt = opt_.optimizers[vs].get();
    if (!fo || !to_opt || first.sharded()) continue;
    to_opt->state().clear();
    for (size_t i = 0; i < fp.size(); ++i) {
      auto it = fo->state().find(fp[i].unsafeGetTensorImpl());
      if (it != fo->state().end()) to_opt->state()[tp[i].unsafeGetTensorImpl()] = deep_copy(*it->second);
    }
  }
}

}  // namespace pipetrain::pipeline
