#include "schedule/simulate.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "common/error.h"

namespace pipetrain::schedule {

Costs Costs::uniform(int virtual_stages, double forward, double backward_input, double backward_weight) {
  Costs c;
  c.forward.assign(virtual_stages, forward);
  c.backward_input.assign(virtual_stages, backward_input);
  c.backward_weight.assign(virtual_stages, backward_weight);
  c.recompute.assign(virtual_stages, 0.0);
  c.activation_bytes.assign(virtual_stages, 0.0);
  return c;
}

namespace {
void check_costs(const Schedule& s, const Costs& c) {
  const size_t V = static_cast<size_t>(s.virtual_stages());
  auto size_ok = [&](const auto& v, const char* name, bool optional) {
    if (v.size() == V || (optional && v.empty())) return;
    throw ScheduleError(detail::concat("simulate: costs.", name, " has ", v.size(),
                                       " entries for ", V, " virtual stages"));
  };
  size_ok(c.forward, "forward", false);
  size_ok(c.backward_input, "backward_input", false);
  size_ok(c.backward_weight, "backward_weight", false);
  size_ok(c.recompute, "recompute", true);
  size_ok(c.activation_bytes, "activation_bytes", true);
  size_ok(c.saved_bytes, "saved_bytes", true);
  size_ok(c.awaiting_weight_bytes, "awaiting_weight_bytes", true);
  size_ok(c.backward_fused, "backward_fused", true);
  size_ok(c.reduce_ms, "reduce_ms", true);
  if (!c.device_bytes_per_ms.empty() && c.device_bytes_per_ms.size() != static_cast<size_t>(s.stages))
    throw ScheduleError(detail::concat("simulate: costs.device_bytes_per_ms has ", c.device_bytes_per_ms.size(), " entries for ",
                                       s.stages, " stages"));
  if (!c.finish_ms.empty() && c.finish_ms.size() != static_cast<size_t>(s.stages))
    throw ScheduleError(detail::concat("simulate: costs.finish_ms has ", c.finish_ms.size(), " entries for ",
                                       s.stages, " stages"));
  if (!c.tail_ms.empty() && c.tail_ms.size() != static_cast<size_t>(s.stages))
    throw ScheduleError(detail::concat("simulate: costs.tail_ms has ", c.tail_ms.size(), " entries for ", s.stages, " stages"));
  if (!c.recomputed.empty() && c.recomputed.size() != static_cast<size_t>(s.micro_batches))
    throw ScheduleError(detail::concat("simulate: costs.recomputed has ", c.recomputed.size(),
                                       " entries for ", s.micro_batches, " micro-batches"));
}
}  // namespace

Simulation simulate(const Schedule& s, const Costs& c) {
  check_costs(s, c);
  const int K = s.stages;
  Simulation out;
  out.busy_ms.assign(K, 0.0);
  out.peak_in_flight.assign(K, 0);
  out.peak_awaiting_weight.assign(K, 0);
  out.spans.resize(K);
  out.span_ms.assign(K, 0.0);
  out.peak_memory.assign(K, 0.0);
  out.memory.assign(K, {{0.0, 0.0}});
  std::vector<double> clock(K, 0.0), held(K, 0.0), first_start(K, -1.0), last_end(K, 0.0);
  std::vector<double> link_free(K, 0.0);  // when each device's link has finished its reductions
  std::vector<int> in_flight(K, 0), awaiting(K, 0);
  std::vector<size_t> pc(K, 0);
  // Delivery time of each message: (destination, receive op, micro-batch, chunk there).
  std::map<std::tuple<int, int, int, int>, double> delivered;

  auto transfer = [&](int from_vs, int to_vs) {
    if (s.device_of(from_vs) == s.device_of(to_vs)) return 0.0;
    const int boundary = std::min(from_vs, to_vs);  // output of `boundary` or its gradient
    double bytes = c.activation_bytes.empty() ? 0.0 : c.activation_bytes[boundary];
    const double bw = c.device_bytes_per_ms.empty()
                          ? c.bytes_per_ms
                          : std::min(c.device_bytes_per_ms[s.device_of(from_vs)], c.device_bytes_per_ms[s.device_of(to_vs)]);
    return c.latency_ms + (bw > 0 ? bytes / bw : 0.0);
  };

  auto recomputed = [&](int m) { return !c.recomputed.empty() && c.recomputed[m] && !c.recompute.empty(); };
  // What micro-batch m holds on virtual stage vs between its forward and its last backward part.
  auto holds = [&](int vs, int m) {
    if (c.saved_bytes.empty()) return 1.0;
    if (recomputed(m)) return vs > 0 && !c.activation_bytes.empty() ? c.activation_bytes[vs - 1] : 0.0;
    return c.saved_bytes[vs];
  };
  auto hold = [&](int r, double at, double bytes) {
    held[r] += bytes;
    out.peak_memory[r] = std::max(out.peak_memory[r], held[r]);
    out.memory[r].emplace_back(at, held[r]);
  };

  size_t remaining = 0;
  for (const auto& l : s.actions) remaining += l.size();
  while (remaining > 0) {
    bool moved = false;
    for (int r = 0; r < K; ++r) {
      while (pc[r] < s.actions[r].size()) {
        const Action& a = s.actions[r][pc[r]];
        const int vs = s.virtual_stage(r, a.chunk);
        const double start = clock[r] + c.action_ms;
        double end = start;
        switch (a.op) {
          case Op::RecvActivation:
          case Op::RecvGrad: {
            auto it = delivered.find({r, static_cast<int>(a.op), a.micro_batch, a.chunk});
            if (it == delivered.end()) goto blocked;
            end = std::max(start, it->second);
            delivered.erase(it);
            break;
          }
          case Op::SendActivation:
            end = start + c.send_ms;
            delivered[{s.device_of(vs + 1), static_cast<int>(Op::RecvActivation), a.micro_batch,
                       s.chunk_of(vs + 1)}] = end + transfer(vs, vs + 1);
            break;
          case Op::SendGrad:
            end = start + c.send_ms;
            delivered[{s.device_of(vs - 1), static_cast<int>(Op::RecvGrad), a.micro_batch,
                       s.chunk_of(vs - 1)}] = end + transfer(vs, vs - 1);
            break;
          case Op::Forward:
            end = start + c.forward[vs];
            hold(r, start, holds(vs, a.micro_batch));
            out.peak_in_flight[r] = std::max(out.peak_in_flight[r], ++in_flight[r]);
            out.peak_awaiting_weight[r] = std::max(out.peak_awaiting_weight[r], ++awaiting[r]);
            break;
          case Op::Backward:
          case Op::BackwardInput: {
            const bool fused_known = a.op == Op::Backward && !c.backward_fused.empty() && c.backward_fused[vs] >= 0;
            end = start + (recomputed(a.micro_batch) ? c.recompute[vs] : 0.0) +
                  (fused_known ? c.backward_fused[vs]
                               : c.backward_input[vs] + (a.op == Op::Backward ? c.backward_weight[vs] : 0.0));
            --in_flight[r];
            if (a.op == Op::Backward) --awaiting[r], hold(r, end, -holds(vs, a.micro_batch));
            if (a.op == Op::BackwardInput && !c.awaiting_weight_bytes.empty()) hold(r, end, c.awaiting_weight_bytes[vs]);
            break;
          }
          case Op::BackwardWeight:
            end = start + c.backward_weight[vs];
            --awaiting[r];
            hold(r, end, -holds(vs, a.micro_batch) - (c.awaiting_weight_bytes.empty() ? 0.0 : c.awaiting_weight_bytes[vs]));
            break;
          case Op::Reduce: {
            const double cost = c.reduce_ms.empty() ? 0.0 : c.reduce_ms[vs];
            const double from = std::max(start, link_free[r]);
            link_free[r] = from + cost;
            out.spans[r].push_back({a.op, a.micro_batch, a.chunk, from, link_free[r]});
            clock[r] = start;
            ++pc[r];
            --remaining;
            moved = true;
            continue;
          }
        }
        if (is_compute(a.op)) {
          out.busy_ms[r] += end - start;
          if (first_start[r] < 0) first_start[r] = start;
          last_end[r] = end;
        }
        out.spans[r].push_back({a.op, a.micro_batch, a.chunk, start, end});
        clock[r] = end;
        ++pc[r];
        --remaining;
        moved = true;
      }
    blocked:
      continue;
    }
    if (!moved) throw ScheduleError("simulate: the schedule deadlocks (run validate() for details)");
  }
  double busy = 0;
  // Each device's own tail (a flush) right after its list, while the others may still run.
  for (int r = 0; r < K && !c.tail_ms.empty(); ++r) {
    if (c.tail_ms[r] <= 0) continue;
    out.spans[r].push_back({Op::BackwardWeight, -1, 0, clock[r], clock[r] + c.tail_ms[r], /*finish=*/true});
    clock[r] += c.tail_ms[r];
    out.busy_ms[r] += c.tail_ms[r];
  }
  // The finishing work (optimizer steps) starts when every device has run its list, as in the
  // executor, which steps no optimizer before the whole step has succeeded.
  out.exposed_reduce_ms.assign(K, 0.0);
  const double lists_done = *std::max_element(clock.begin(), clock.end());
  for (int r = 0; r < K; ++r) {
    out.exposed_reduce_ms[r] = std::max(0.0, link_free[r] - lists_done);
    clock[r] = std::max(clock[r], link_free[r]);
  }
  const double all_done = *std::max_element(clock.begin(), clock.end());
  for (int r = 0; r < K; ++r) {
    out.span_ms[r] = first_start[r] < 0 ? 0.0 : last_end[r] - first_start[r];
    if (!c.finish_ms.empty()) {
      clock[r] = all_done;
      out.spans[r].push_back({Op::Forward, -1, 0, clock[r], clock[r] + c.finish_ms[r], /*finish=*/true});
      clock[r] += c.finish_ms[r];
      out.busy_ms[r] += c.finish_ms[r];
    }
    out.makespan_ms = std::max(out.makespan_ms, clock[r]);
    busy += out.busy_ms[r];
  }
  out.bubble = out.makespan_ms > 0 ? 1.0 - busy / (K * out.makespan_ms) : 0.0;
  return out;
}

}  // namespace pipetrain::schedule
