// The reduction's speed (profiler/collectives.h).
#include "profiler/collectives.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "comm/process_group.h"
#include "common/stats.h"

namespace pipetrain::profiler {

namespace {

// One collective on a member's tensors: `flat` holds the whole tensor, `part` its 1/D slice.
using Collective = std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&, at::Tensor& flat, at::Tensor& part)>;

// Median milliseconds of `op` on `numel` floats (a multiple of the group's size) among every
// member of `group`.
double time_collective(const std::vector<comm::ProcessGroup>& group, const Collective& op, int64_t numel, int repeat,
                       double timeout_s) {
  const int D = static_cast<int>(group.size());
  std::vector<std::vector<double>> times(D);
  std::vector<std::exception_ptr> errors(D);
  std::vector<std::thread> members;
  for (int d = 0; d < D; ++d)
    members.emplace_back([&, d] {
      try {
        at::Tensor flat = torch::ones({numel}), part = torch::ones({numel / D});
        for (int i = 0; i <= repeat; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          comm::wait_work(op(*group[d], flat, part), Deadline::after(timeout_s));
          if (i) times[d].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
      } catch (...) {
        errors[d] = std::current_exception();
      }
    });
  for (auto& m : members) m.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return median(times[0]);  // every member ends a collective together
}

LinkFit fit(const std::vector<comm::ProcessGroup>& group, const Collective& op, int repeat, double timeout_s) {
  const int64_t D = static_cast<int64_t>(group.size());
  const int64_t small = (64 << 10) / D * D, large = (2 << 20) / D * D;  // floats: 256 KiB and 8 MiB
  const double t_small = time_collective(group, op, small, repeat, timeout_s);
  const double t_large = time_collective(group, op, large, repeat, timeout_s);
  LinkFit f;
  const double bytes = static_cast<double>((large - small) * 4);
  // A noisy machine can time the larger one no slower: then the whole time is bandwidth.
  f.bytes_per_ms = t_large > t_small ? bytes / (t_large - t_small) : static_cast<double>(large * 4) / t_large;
  f.latency_ms = std::max(0.0, t_small - static_cast<double>(small * 4) / f.bytes_per_ms);
  return f;
}

}  // namespace

ReduceLink measure_reductions(int members, int repeat, double timeout_s) {
  if (members < 2) return {};
  const auto groups = comm::make_local_gloo_groups(1, members, timeout_s);
  const auto& g = groups[0];
  ReduceLink link;
  link.all_reduce = fit(g, [](c10d::Backend& b, at::Tensor& flat, at::Tensor&) {
    std::vector<at::Tensor> t{flat};
    return comm::all_reduce(b, t);
  }, repeat, timeout_s);
  link.reduce_scatter = fit(g, [](c10d::Backend& b, at::Tensor& flat, at::Tensor& part) {
    return comm::reduce_scatter(b, part, flat);
  }, repeat, timeout_s);
  link.all_gather = fit(g, [](c10d::Backend& b, at::Tensor& flat, at::Tensor& part) {
    return comm::all_gather(b, flat, part);
  }, repeat, timeout_s);
  link.shard_by_all_reduce = true;
  return link;
}

ReduceLink ring_link(int members, double latency_ms, double bytes_per_ms) {
  if (members < 2 || bytes_per_ms <= 0) return {};
  const double share = static_cast<double>(members - 1) / members;
  ReduceLink link;
  link.all_reduce = {latency_ms, bytes_per_ms / (2 * share)};
  link.reduce_scatter = link.all_gather = {latency_ms, bytes_per_ms / share};
  return link;
}

}  // namespace pipetrain::profiler
