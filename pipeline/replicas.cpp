// Gradient reduction across replicas (pipeline/replicas.h).
#include "pipeline/replicas.h"

#include <algorithm>
#include <chrono>

#include <torch/torch.h>

#include "common/error.h"

namespace pipetrain::pipeline {

namespace {
double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }
}  // namespace

GradientReducer::GradientReducer(comm::ProcessGroup group, ReplicaInfo info, std::vector<at::Tensor> params,
                                 bool shard, int64_t bucket_bytes, bool scatter)
    : group_(std::move(group)), info_(std::move(info)), params_(std::move(params)), shard_(shard),
      bucket_bytes_(std::max<int64_t>(1, bucket_bytes)), scatter_(scatter) {
  if (shard_) {
    for (const auto& p : params_) {
      if (p.scalar_type() != params_.front().scalar_type())
        throw ConfigError(detail::concat(info_.name, ": a sharded optimizer needs one dtype for all of a stage's parameters, found ",
                                         c10::toString(params_.front().scalar_type()), " and ", c10::toString(p.scalar_type())));
      numel_ += p.numel();
    }
    const int64_t D = info_.data_parallel;
    padded_ = (numel_ + D - 1) / D * D;
    refresh_shard();
    return;
  }
  // Buckets in reverse parameter order (the order backward produces them), one dtype each.
  int64_t bytes = 0;
  for (size_t i = params_.size(); i-- > 0;) {
    const at::Tensor& p = params_[i];
    const int64_t b = p.numel() * static_cast<int64_t>(p.element_size());
    if (buckets_.empty() || bytes + b > bucket_bytes_ ||
        params_[buckets_.back().front()].scalar_type() != p.scalar_type()) {
      buckets_.emplace_back();
      bytes = 0;
    }
    buckets_.back().push_back(i);
    bytes += b;
  }
}

at::Tensor GradientReducer::flat_parameters() const {
  std::vector<at::Tensor> parts;
  for (const auto& p : params_) parts.push_back(p.detach().reshape({-1}));
  at::Tensor flat = parts.empty() ? at::zeros({0}) : torch::cat(parts);
  if (padded_ > numel_) flat = torch::cat({flat, at::zeros({padded_ - numel_}, flat.options())});
  return flat;
}

void GradientReducer::refresh_shard() {
  const int64_t s = padded_ / info_.data_parallel;
  at::Tensor slice = flat_parameters().narrow(0, info_.copy * s, s);
  // In place once the optimizer holds it (its state is keyed by the tensor).
  if (shard_param_.defined())
    shard_param_.detach().copy_(slice);
  else
    shard_param_ = slice.clone();
}

void GradientReducer::fail(const std::exception& e) {
  const auto* timeout = dynamic_cast<const TimeoutError*>(&e);
  throw ReductionError(info_.peer, timeout ? detail::concat(info_.name, ": no answer from ", info_.others,
                                                            " before the deadline")
                                           : detail::concat(info_.name, " failed (", info_.others,
                                                            " died, closed or aborted): ", e.what()));
}

void GradientReducer::wait(const c10::intrusive_ptr<c10d::Work>& work, Deadline deadline) {
  try {
    comm::wait_work(work, deadline);
  } catch (const std::exception& e) {
    fail(e);
  }
}

void GradientReducer::start() {
  torch::NoGradGuard no_grad;
  works_.clear();
  flats_.clear();
  done_at_->store(0.0);
  auto record = [this](const c10::intrusive_ptr<c10d::Work>& work) {
    auto done = done_at_;
    try {  // when it completed, where the backend tells (Gloo's reduce-scatter does not)
      work->getFuture()->addCallback([done](c10::ivalue::Future&) {
        const double t = now_s();
        double seen = done->load();
        while (t > seen && !done->compare_exchange_weak(seen, t)) {
        }
      });
    } catch (const c10::Error&) {
    }
    works_.push_back(work);
  };
  if (shard_) {
    std::vector<at::Tensor> parts;
    for (const auto& p : params_)
      parts.push_back(p.grad().defined() ? p.grad().reshape({-1}) : at::zeros({p.numel()}, p.options()));
    if (padded_ > numel_) parts.push_back(at::zeros({padded_ - numel_}, params_.front().options()));
    at::Tensor flat = torch::cat(parts);
    flats_.push_back(flat);
    if (scatter_) {
      shard_grad_ = at::empty({padded_ / info_.data_parallel}, flat.options());
      record(comm::reduce_scatter(*group_, shard_grad_, flat));
    } else {
      std::vector<at::Tensor> whole{flat};
      record(comm::all_reduce(*group_, whole));
    }
    return;
  }
  for (const auto& bucket : buckets_) {
    std::vector<at::Tensor> parts;
    for (size_t i : bucket)
      if (params_[i].grad().defined()) parts.push_back(params_[i].grad().reshape({-1}));
    if (parts.empty()) {
      flats_.emplace_back();
      continue;
    }
    std::vector<at::Tensor> flat{torch::cat(parts)};
    flats_.push_back(flat[0]);
    record(comm::all_reduce(*group_, flat));
  }
}

void GradientReducer::begin_step(bool accumulate) {
  if (!accumulate) {
    held_.clear();
    reduced_ = false;
    if (shard_ && shard_param_.defined()) shard_param_.mutable_grad() = at::Tensor();
    return;
  }
  if (shard_ || !reduced_) return;
  held_.clear();
  for (auto& p : params_) {
    held_.push_back(p.grad());
    p.mutable_grad() = at::Tensor();
  }
  reduced_ = false;
}

double GradientReducer::finish(Deadline deadline) {
  for (const auto& w : works_) wait(w, deadline);
  torch::NoGradGuard no_grad;
  if (shard_) {
    if (!works_.empty()) {
      if (!scatter_) {  // the whole sum arrived: keep this replica's slice
        const int64_t s = padded_ / info_.data_parallel;
        shard_grad_ = flats_.front().narrow(0, info_.copy * s, s).clone();
      }
      // Onto a reduced gradient of this accumulation (begin_step), else in its place.
      const at::Tensor before = shard_param_.grad();
      shard_param_.mutable_grad() = before.defined() ? before + shard_grad_ : shard_grad_;
      // The local, unreduced gradients are not needed any more.
      for (auto& p : params_) p.mutable_grad() = at::Tensor();
    }
  } else {
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (!flats_[b].defined()) continue;
      int64_t offset = 0;
      for (size_t i : buckets_[b]) {
        at::Tensor& g = params_[i].mutable_grad();
        if (!g.defined()) continue;
        g.copy_(flats_[b].narrow(0, offset, g.numel()).view_as(g));
        offset += g.numel();
      }
    }
    // What an earlier reduction of this accumulation summed, back beside this one's sum.
    for (size_t i = 0; i < held_.size(); ++i) {
      if (!held_[i].defined()) continue;
      at::Tensor& g = params_[i].mutable_grad();
      if (g.defined())
        g.add_(held_[i]);
      else
        g = held_[i];
    }
    held_.clear();
    reduced_ = true;
  }
  const double done = done_at_->load();
  works_.clear();
  flats_.clear();
  return done > 0 ? done : now_s();
}

void GradientReducer::leave_out_of_norm(const std::vector<bool>& by_param) {
  counted_.clear();
  if (!shard_ || std::none_of(by_param.begin(), by_param.end(), [](bool b) { return b; })) return;
  const int64_t s = padded_ / info_.data_parallel, lo = info_.copy * s, hi = lo + s;
  int64_t offset = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t begin = std::max(offset, lo), end = std::min(offset + params_[i].numel(), hi);
    offset += params_[i].numel();
    if (begin >= end || (i < by_param.size() && by_param[i])) continue;
    if (!counted_.empty() && counted_.back().first + counted_.back().second == begin - lo)
      counted_.back().second += end - begin;  // runs next to each other as one
    else
      counted_.emplace_back(begin - lo, end - begin);
  }
  if (counted_.empty()) counted_.emplace_back(0, 0);  // nothing of this slice counts
}

double GradientReducer::grad_sq_norm(Deadline deadline) {
  std::vector<at::Tensor> sq{torch::zeros({1}, torch::kDouble)};
  if (shard_param_.grad().defined()) {
    at::Tensor g = shard_param_.grad();
    if (!counted_.empty()) {
      std::vector<at::Tensor> runs;
      for (const auto& [at, n] : counted_) runs.push_back(g.narrow(0, at, n));
      g = torch::cat(runs);
    }
    const double n = g.norm().item<double>();
    sq[0].fill_(n * n);
  }
  wait(comm::all_reduce(*group_, sq), deadline);
  return sq[0].item<double>();
}

void GradientReducer::gather_parameters(Deadline deadline) {
  torch::NoGradGuard no_grad;
  at::Tensor all = at::empty({padded_}, shard_param_.options());
  at::Tensor mine = shard_param_.detach();
  wait(comm::all_gather(*group_, all, mine), deadline);
  int64_t offset = 0;
  for (auto& p : params_) {
    p.detach().copy_(all.narrow(0, offset, p.numel()).view_as(p));
    offset += p.numel();
  }
}

std::vector<at::Tensor> GradientReducer::gather_state(const at::Tensor& slice, Deadline deadline) {
  at::Tensor all = at::empty({padded_}, slice.options());
  at::Tensor mine = slice.detach().contiguous();
  wait(comm::all_gather(*group_, all, mine), deadline);
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const auto& p : params_) {
    out.push_back(all.narrow(0, offset, p.numel()).view(p.sizes()).clone());
    offset += p.numel();
  }
  return out;
}

at::Tensor GradientReducer::slice_of(const std::vector<at::Tensor>& full) const {
  std::vector<at::Tensor> parts;
  for (const auto& t : full) parts.push_back(t.detach().reshape({-1}));
  at::Tensor flat = torch::cat(parts);
  if (padded_ > numel_) flat = torch::cat({flat, at::zeros({padded_ - numel_}, flat.options())});
  const int64_t s = padded_ / info_.data_parallel;
  return flat.narrow(0, info_.copy * s, s).clone();
}

}  // namespace pipetrain::pipeline
