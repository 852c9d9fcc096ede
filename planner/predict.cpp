// One prediction (predict.h).
#include "planner/predict.h"

#include <algorithm>

#include "profiler/profile.h"
#include "schedule/auto.h"

namespace pipetrain::planner {

bool defers(const profiler::Profile& p, size_t i) {
  return i < p.deferred_bytes.size() && i < p.deferred_backward_ms.size() && p.deferred_bytes[i] > 0;
}

namespace {
// Deferring, what layers [first, last) stash: every micro-batch's, held to the end of the step,
// and the largest layer's alone (at the flush its pieces are concatenated beside the rest).
struct Stash {
  int64_t all = 0, largest = 0;
  int64_t peak() const { return all + largest; }
};
Stash stash_of(const profiler::Profile& p, int first, int last, int micro_batches) {
  Stash s;
  for (int i = first; i < last; ++i)
    if (defers(p, i)) s.all += micro_batches * p.deferred_bytes[i], s.largest = std::max(s.largest, micro_batches * p.deferred_bytes[i]);
  return s;
}
}  // namespace

bool any_deferred(const profiler::Profile& p) {
  for (size_t i = 0; i < p.layers.size(); ++i)
    if (defers(p, i)) return true;
  return false;
}

schedule::Costs schedule_costs(const profiler::Profile& p, const partitioner::Balance& balance,
                               const schedule::Schedule& s, Recompute recompute, const profiler::Profile* deferred) {
  const int V = s.virtual_stages();
  schedule::Costs c = schedule::Costs::uniform(V, 0, 0, 0);
  const auto off = partitioner::offsets(balance);
  const bool split = schedule::splits_backward(s.kind);
  auto defer = [&](int i) { return deferred && defers(p, i) && static_cast<size_t>(i) < deferred->flush_ms.size(); };
  // A layer's fused backward, and what deferring takes out of its W.
  auto fused = [&](int i) { return defer(i) ? p.deferred_backward_ms[i] : p.layers[i].backward_ms; };
  auto weight = [&](int i) {
    return defer(i) ? std::max(0.0, p.backward_weight_ms[i] - (p.layers[i].backward_ms - fused(i))) : p.backward_weight_ms[i];
  };
  std::vector<double> flush(s.stages, 0.0);
  for (int v = 0; v < V; ++v) {
    for (int i = off[v]; i < off[v + 1]; ++i) {
      c.forward[v] += p.layers[i].forward_ms;
      c.recompute[v] += p.layers[i].forward_ms;
      if (split) {
        c.backward_input[v] += p.backward_input_ms[i];
        c.backward_weight[v] += weight(i);
      } else {
        c.backward_input[v] += fused(i);
      }
      if (defer(i)) flush[s.device_of(v)] += deferred->flush_ms[i];
    }
    if (split && v == 0) {  // the first stage's input needs no gradient: W is its whole backward
      c.backward_weight[v] = 0;
      for (int i = off[0]; i < off[1]; ++i) c.backward_weight[v] += fused(i);
      c.backward_input[v] = 0;
    }
    c.activation_bytes[v] = static_cast<double>(p.layers[off[v + 1] - 1].activation_bytes);
    c.saved_bytes.push_back(0);
    for (int i = off[v]; i < off[v + 1]; ++i) c.saved_bytes[v] += static_cast<double>(p.layers[i].saved_bytes);
    if (split && !p.awaiting_weight_bytes.empty()) {
      c.awaiting_weight_bytes.resize(V, 0.0);
      if (v > 0)  // the first stage's W is its whole backward: nothing waits between
        for (int i = off[v]; i < off[v + 1]; ++i)
          c.awaiting_weight_bytes[v] += static_cast<double>(p.awaiting_weight_bytes[i]);
    }
  }
  if (!p.optimizer_ms.empty()) {
    c.finish_ms.assign(s.stages, 0.0);
    for (int v = 0; v < V; ++v)
      for (int i = off[v]; i < off[v + 1]; ++i) c.finish_ms[s.device_of(v)] += p.optimizer_ms[i];
  }
  if (deferred) c.tail_ms = flush;  // each device's flush right after its own list
  c.recomputed.assign(s.micro_batches, false);
  for (int m = 0; m < s.micro_batches; ++m)
    c.recomputed[m] = recompute == Recompute::Always ||
                      (recompute == Recompute::ExceptLast && m != s.micro_batches - 1);
  return c;
}

profiler::Profile profile_of(std::vector<partitioner::LayerCost> layers) {
  profiler::Profile p;
  for (const auto& l : layers) {  // without a measured split, assume B and W halve the backward
    const bool given = l.backward_input_ms >= 0;
    p.backward_input_ms.push_back(given ? l.backward_input_ms : l.backward_ms / 2);
    p.backward_weight_ms.push_back(given ? l.backward_weight_ms : l.backward_ms / 2);
  }
  p.layers = std::move(layers);
  return p;
}

void apply_speeds(schedule::Costs& costs, const schedule::Schedule& s, const std::vector<double>& speeds) {
  if (speeds.empty()) return;
  for (int v = 0; v < s.virtual_stages(); ++v) {
    const double speed = speeds.at(s.device_of(v));
    costs.forward[v] /= speed, costs.backward_input[v] /= speed;
    costs.backward_weight[v] /= speed, costs.recompute[v] /= speed;
  }
  for (size_t d = 0; d < costs.tail_ms.size(); ++d) costs.tail_ms[d] /= speeds.at(d);  // a flush computes too
}

void add_reductions(schedule::Costs& costs, const profiler::Profile& p, const partitioner::Balance& balance,
                    const schedule::Schedule& s, const DataParallelPlan& dp) {
  if (dp.copies < 2) return;
  const auto off = partitioner::offsets(balance);
  const int V = s.virtual_stages();
  costs.reduce_ms.assign(V, 0.0);
  if (costs.finish_ms.empty()) costs.finish_ms.assign(s.stages, 0.0);
  for (int v = 0; v < V; ++v) {
    double bytes = 0, optimizer_ms = 0;
    for (int i = off[v]; i < off[v + 1]; ++i) {
      bytes += static_cast<double>(p.layers[i].trained_bytes());  // the frozen have no gradient
      if (!p.optimizer_ms.empty()) optimizer_ms += p.optimizer_ms[i];
    }
    if (bytes == 0) continue;  // no parameters: nothing to reduce
    const double speed = dp.link_speed.empty() ? 1.0 : dp.link_speed.at(s.device_of(v));
    if (!dp.sharded) {
      costs.reduce_ms[v] = dp.link.all_reduce.time_ms(bytes, speed);
      continue;
    }
    costs.reduce_ms[v] = dp.link.shard_reduce().time_ms(bytes, speed);
    double& finish = costs.finish_ms[s.device_of(v)];
    finish += dp.link.all_gather.time_ms(bytes, speed) - optimizer_ms + optimizer_ms / dp.copies;
  }
}

// Tied parameters at the optimizer step, as the executor runs them (pipeline/ties.cpp): where a
// tie's members sit on other devices than its first's, each of their gradients travels to the
// first's device and the sum comes back to each of those devices (transfers as between stages:
// free where transfers are); each device that holds a member waits for its tie's whole exchange.
// With a sharded optimizer the ties are summed before the reduction, so the stages that hold a
// member reduce at the step, not beside the backward; with three copies or more the first
// member's value travels once more after the step.
void add_ties(schedule::Costs& costs, const schedule::Schedule& s, const PlanPoint& pt) {
  if (pt.ties.empty()) return;
  const auto off = partitioner::offsets(pt.balance);
  const int V = s.virtual_stages();
  const bool sharded = pt.data_parallel.copies > 1 && pt.data_parallel.sharded;
  if (costs.finish_ms.empty()) costs.finish_ms.assign(s.stages, 0.0);
  std::vector<bool> held(V, false);
  auto virtual_stage = [&](int layer) {
    int v = 0;
    while (v + 1 < V && off[v + 1] <= layer) ++v;
    return v;
  };
  auto hop = [&](int a, int b, int64_t bytes) {
    const double bw = pt.device_bytes_per_ms.empty() ? pt.bytes_per_ms : std::min(pt.device_bytes_per_ms.at(a), pt.device_bytes_per_ms.at(b));
    return pt.latency_ms + (bw > 0 ? static_cast<double>(bytes) / bw : 0.0);
  };
  for (const partitioner::TieCost& t : pt.ties) {
    std::vector<int> devices;  // each member's, in member order
    for (int layer : t.layers) {
      const int v = virtual_stage(layer);
      held[v] = held[v] || sharded;
      devices.push_back(s.device_of(v));
    }
    if (devices.empty()) continue;
    const int owner = devices.front();
    std::vector<int> others;  // the other devices, each once
    double ms = 0;
    for (int d : devices) {
      if (d == owner) continue;
      ms += hop(d, owner, t.bytes);  // a member's gradient to the first's device
      if (std::find(others.begin(), others.end(), d) == others.end()) others.push_back(d);
    }
    for (int d : others) ms += hop(owner, d, t.bytes) * (sharded && pt.data_parallel.copies >= 3 ? 2 : 1);  // the sum (and the value)
    if (others.empty()) continue;
    costs.finish_ms[owner] += ms;
    for (int d : others) costs.finish_ms[d] += ms;
  }
  if (costs.reduce_ms.empty()) return;
  for (int v = 0; v < V; ++v)
    if (held[v]) {
      costs.finish_ms[s.device_of(v)] += costs.reduce_ms[v];
      costs.reduce_ms[v] = 0;
    }
}

void add_straggler_wait(schedule::Costs& costs, const schedule::Schedule& s, double share) {
  if (share <= 0 || costs.reduce_ms.empty()) return;
  const int V = s.virtual_stages();
  std::vector<double> compute(s.stages, 0.0);
  std::vector<int> chunks(s.stages, 0);
  for (int v = 0; v < V; ++v) {
    const int d = s.device_of(v);
    compute[d] += s.micro_batches * (costs.forward[v] + costs.backward_input[v] + costs.backward_weight[v]);
    ++chunks[d];
  }
  for (int v = 0; v < V; ++v) costs.reduce_ms[v] += share * compute[s.device_of(v)] / chunks[s.device_of(v)];
}

std::vector<double> device_peak_bytes(const profiler::Profile& p, const partitioner::Balance& balance,
                                      const schedule::Schedule& s, const schedule::Simulation& sim, Recompute recompute,
                                      double state_factor, bool deferred) {
  const auto off = partitioner::offsets(balance);
  std::vector<double> params(s.stages, 0.0), trained(s.stages, 0.0), rebuilt(s.stages, 0.0), workspace(s.stages, 0.0), peak(s.stages);
  std::vector<Stash> stash(s.stages);  // deferred weight gradients: the device's chunks together
  for (int vs = 0; vs < s.virtual_stages(); ++vs) {
    const int d = s.device_of(vs);
    double saved = 0;
    for (int i = off[vs]; i < off[vs + 1]; ++i) {
      params[d] += static_cast<double>(p.layers[i].param_bytes);
      trained[d] += static_cast<double>(p.layers[i].trained_bytes());
      saved += static_cast<double>(p.layers[i].saved_bytes);
      workspace[d] = std::max(workspace[d], static_cast<double>(p.layers[i].workspace_bytes));
    }
    if (deferred) {
      const Stash chunk = stash_of(p, off[vs], off[vs + 1], s.micro_batches);
      stash[d].all += chunk.all, stash[d].largest = std::max(stash[d].largest, chunk.largest);
    }
    if (recompute != Recompute::Never) rebuilt[d] = std::max(rebuilt[d], saved);
  }
  // One layer runs at a time on a device: its largest workspace comes on top of what is held.
  for (int d = 0; d < s.stages; ++d)
    peak[d] = params[d] + trained[d] * state_factor + sim.peak_memory.at(d) + rebuilt[d] + workspace[d] +
              static_cast<double>(stash[d].peak());
  return peak;
}

double Prediction::max_peak_bytes() const {
  return peak_bytes.empty() ? 0.0 : *std::max_element(peak_bytes.begin(), peak_bytes.end());
}

Prediction predict(const PlanPoint& pt, const profiler::Profile& profile, const profiler::Profile* whole,
                   const schedule::Schedule* run) {
  Prediction out;
  const int D = pt.data_parallel.copies;
  // The costs need the schedule's shape only (devices, chunks, micro-batches), not its lists.
  const schedule::Schedule shape{pt.schedule, pt.stages, pt.micro_batches, pt.chunks, {}, schedule::placement_of(pt.schedule)};
  const profiler::Profile* flush = pt.defer ? whole : nullptr;
  out.costs = schedule_costs(profile, pt.balance, shape, pt.recompute, flush);
  apply_speeds(out.costs, shape, pt.speeds);
  out.costs.latency_ms = pt.latency_ms, out.costs.bytes_per_ms = pt.bytes_per_ms;
  out.costs.device_bytes_per_ms = pt.device_bytes_per_ms;
  if (D > 1) {
    add_reductions(out.costs, profile, pt.balance, shape, pt.data_parallel);
    out.reduce_ms = out.costs.reduce_ms;  // before the straggler wait: the reduction itself
    add_straggler_wait(out.costs, shape, pt.straggler);
  }
  add_ties(out.costs, shape, pt);
  if (run) {
    out.schedule = *run;
  } else if (pt.search_on_costs && schedule::info(pt.schedule).searched) {
    const double limit = pt.search_memory_limit > 0 ? pt.search_memory_limit
                                                    : schedule::twice_1f1b_memory(pt.stages, pt.micro_batches, out.costs);
    out.schedule = schedule::make_zb_auto(pt.stages, pt.micro_batches, out.costs, limit);
    if (D > 1) out.schedule = schedule::with_reductions(std::move(out.schedule));
  } else {
    out.schedule = schedule::pipeline_schedule(pt.schedule, pt.stages, pt.micro_batches, pt.chunks, D);
  }
  out.simulation = schedule::simulate(out.schedule, out.costs);
  out.step_ms = out.simulation.makespan_ms;
  out.bubble = out.simulation.bubble;
  for (double e : out.simulation.exposed_reduce_ms) out.exposed_reduce_ms = std::max(out.exposed_reduce_ms, e);
  out.peak_bytes = device_peak_bytes(profile, pt.balance, out.schedule, out.simulation, pt.recompute, pt.state_factor,
                                     flush != nullptr);
  return out;
}

}  // namespace pipetrain::planner
