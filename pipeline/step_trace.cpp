#include "pipeline/step_trace.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "common/error.h"
#include "common/stats.h"

namespace pipetrain::pipeline {

using schedule::Op;

std::vector<std::vector<schedule::TraceSpan>> timeline(const StepTrace& t, double origin_s) {
  std::vector<std::vector<schedule::TraceSpan>> out(t.spans.size());
  const double base_ms = (t.start - origin_s) * 1e3;
  for (size_t r = 0; r < t.spans.size(); ++r)
    for (const Span& s : t.spans[r]) {
      const double start = base_ms + s.start * 1e3, end = base_ms + s.end * 1e3;
      if (s.recompute > 0) {
        out[r].push_back({"recompute", s.micro_batch, s.chunk, t.step, start, start + s.recompute * 1e3});
        out[r].push_back({schedule::op_name(s.op), s.micro_batch, s.chunk, t.step, start + s.recompute * 1e3, end});
      } else {
        out[r].push_back({schedule::op_name(s.op), s.micro_batch, s.chunk, t.step, start, end});
      }
    }
  for (size_t r = 0; r < t.optimizer.size() && r < out.size(); ++r)
    if (t.optimizer[r].second > t.optimizer[r].first)
      out[r].push_back({"optimizer", -1, 0, t.step, base_ms + t.optimizer[r].first * 1e3,
                        base_ms + t.optimizer[r].second * 1e3});
  return out;
}

std::vector<StageBreakdown> breakdown(const StepTrace& t) {
  std::vector<StageBreakdown> out(t.spans.size());
  for (size_t r = 0; r < t.spans.size(); ++r) {
    StageBreakdown& b = out[r];
    if (r < t.page_faults.size()) b.page_faults = t.page_faults[r];
    // The list's actions in order (a reduction only starts in its action; it runs beside the list).
    double at = 0, reduced = 0;
    bool first = true;
    for (const Span& s : t.spans[r]) {
      if (s.op == Op::Reduce) {
        reduced = std::max(reduced, s.end);
        continue;
      }
      const double start = std::max(s.start, at), end = std::max(s.end, start);  // device times may overlap the host's
      (first ? b.idle_start : b.between) += start - at;
      first = false;
      const double d = end - start;
      switch (s.op) {
        case Op::Forward: b.forward += d; break;
        case Op::Backward: b.recompute += std::min(s.recompute, d), b.backward += d - std::min(s.recompute, d); break;
        case Op::BackwardInput: b.recompute += std::min(s.recompute, d), b.backward_input += d - std::min(s.recompute, d); break;
        case Op::BackwardWeight: b.backward_weight += d; break;
        case Op::RecvActivation: b.wait_input += d; break;
        case Op::RecvGrad: b.wait_grad += d; break;
        case Op::SendActivation: case Op::SendGrad: b.send += d; break;
        case Op::Reduce: break;
      }
      at = end;
    }
    if (reduced > at) b.reduce_wait = reduced - at, at = reduced;
    const auto [opt_start, opt_end] = r < t.optimizer.size() ? t.optimizer[r] : std::pair<double, double>{0, 0};
    if (opt_end > opt_start && opt_start >= at) {
      b.end_wait = opt_start - at;
      b.optimizer = opt_end - opt_start;
      at = opt_end;
    }
    b.idle_end = std::max(0.0, t.wall - at);
  }
  return out;
}

std::vector<double> stage_busy_ms(const StepTrace& t) {
  std::vector<double> out(t.spans.size(), 0.0);
  for (size_t r = 0; r < t.spans.size(); ++r) {
    for (const Span& s : t.spans[r])
      if (schedule::is_compute(s.op)) out[r] += (s.end - s.start) * 1e3;
    if (r < t.optimizer.size()) out[r] += (t.optimizer[r].second - t.optimizer[r].first) * 1e3;
  }
  return out;
}

double bubble(const StepTrace& t) {
  double busy_ms = 0;
  for (double b : stage_busy_ms(t)) busy_ms += b;
  return t.wall > 0 ? 1.0 - busy_ms / 1e3 / (static_cast<double>(t.spans.size()) * t.wall) : 0.0;
}

namespace {
// Delivery latency: for each receive that had to wait, from the end of the matching send to the
// end of the receive (the wake-up of the waiting stage); the median.
double delivery_latency_ms(const StepTrace& t, const schedule::Schedule& s) {
  std::map<std::tuple<int, int, int, int>, double> sent;  // (destination, recv op, mb, chunk there) -> end
  for (size_t r = 0; r < t.spans.size(); ++r)
    for (const Span& sp : t.spans[r]) {
      const int vs = s.virtual_stage(static_cast<int>(r), sp.chunk);
      if (sp.op == Op::SendActivation)
        sent[{s.device_of(vs + 1), static_cast<int>(Op::RecvActivation), sp.micro_batch, s.chunk_of(vs + 1)}] = sp.end;
      else if (sp.op == Op::SendGrad)
        sent[{s.device_of(vs - 1), static_cast<int>(Op::RecvGrad), sp.micro_batch, s.chunk_of(vs - 1)}] = sp.end;
    }
  std::vector<double> latency;
  for (size_t r = 0; r < t.spans.size(); ++r)
    for (const Span& sp : t.spans[r]) {
      if (sp.op != Op::RecvActivation && sp.op != Op::RecvGrad) continue;
      auto it = sent.find({static_cast<int>(r), static_cast<int>(sp.op), sp.micro_batch, sp.chunk});
      if (it != sent.end() && it->second > sp.start) latency.push_back((sp.end - it->second) * 1e3);
    }
  return median(latency);
}
}  // namespace

schedule::Costs measured_costs(const StepTrace& t, const schedule::Schedule& s) {
  const int V = s.virtual_stages();
  std::vector<std::vector<double>> fwd(V), bin(V), fused(V), bw(V), rec(V), red(V);
  std::vector<double> sends, flushed(t.spans.size(), 0.0);
  double gaps = 0;
  size_t actions = 0;
  schedule::Costs c = schedule::Costs::uniform(V, 0, 0, 0);
  c.recomputed.assign(s.micro_batches, false);
  for (size_t r = 0; r < t.spans.size(); ++r) {
    double previous_end = 0;
    for (size_t i = 0; i < t.spans[r].size(); ++i) {
      const Span& sp = t.spans[r][i];
      const int vs = s.virtual_stage(static_cast<int>(r), sp.chunk);
      const double ms = (sp.end - sp.start) * 1e3, rc = sp.recompute * 1e3;
      if (sp.op == Op::Reduce) {  // from its start to its end, beside the actions after it
        red[vs].push_back(ms);
        continue;
      }
      gaps += sp.start - previous_end;
      previous_end = sp.end;
      ++actions;
      switch (sp.op) {
        case Op::Forward: fwd[vs].push_back(ms); break;
        case Op::Backward:
        case Op::BackwardInput:
          (sp.op == Op::Backward ? fused : bin)[vs].push_back(ms - rc);
          if (rc > 0) {
            rec[vs].push_back(rc);
            c.recomputed[sp.micro_batch] = true;
          }
          break;
        case Op::BackwardWeight:
          if (sp.micro_batch >= 0)
            bw[vs].push_back(ms);
          else  // deferred weight gradients, flushed once for the step: charged at the device's end
            flushed[r] += ms;
          break;
        case Op::SendActivation:
        case Op::SendGrad: sends.push_back(ms); break;
        default: break;
      }
    }
  }
  c.send_ms = median(sends);
  c.latency_ms = delivery_latency_ms(t, s);
  c.finish_ms.assign(s.stages, 0.0);
  for (size_t r = 0; r < t.optimizer.size() && r < c.finish_ms.size(); ++r)
    c.finish_ms[r] = (t.optimizer[r].second - t.optimizer[r].first) * 1e3;
  c.tail_ms.assign(s.stages, 0.0);  // the flush, right after the device's list
  for (size_t r = 0; r < flushed.size() && r < c.tail_ms.size(); ++r) c.tail_ms[r] = flushed[r];
  c.action_ms = actions ? gaps * 1e3 / static_cast<double>(actions) : 0.0;
  for (int v = 0; v < V; ++v) {
    c.forward[v] = median(fwd[v]);
    // A schedule that fuses some backwards of a virtual stage and splits others (dualpipev)
    // gets both costs; one that only fuses has B = the fused backward and W = 0.
    c.backward_input[v] = median(bin[v].empty() ? fused[v] : bin[v]);
    c.backward_weight[v] = median(bw[v]);
    if (!bin[v].empty() && !fused[v].empty()) {
      c.backward_fused.resize(V, -1.0);
      c.backward_fused[v] = median(fused[v]);
    }
    c.recompute[v] = median(rec[v]);
    if (!red[v].empty()) {
      c.reduce_ms.resize(V, 0.0);
      c.reduce_ms[v] = median(red[v]);
    }
  }
  return c;
}

namespace {
constexpr int kSpanFields = 6;  // op, micro-batch, chunk, start, end, recompute
}  // namespace

std::vector<double> encode_step_result(const StepResult& r) {
  std::vector<double> v{static_cast<double>(r.losses.size()), static_cast<double>(r.spans.size())};
  v.insert(v.end(), r.losses.begin(), r.losses.end());
  v.push_back(r.peak_in_flight);
  v.push_back(r.peak_awaiting_weight);
  for (const Span& sp : r.spans)
    v.insert(v.end(), {static_cast<double>(static_cast<int>(sp.op)), static_cast<double>(sp.micro_batch),
                       static_cast<double>(sp.chunk), sp.start, sp.end, sp.recompute});
  return v;
}

StepResult decode_step_result(const double* v, int64_t n, int micro_batches) {
  auto whole = [](double x, double lo, double hi) { return x >= lo && x <= hi && x == static_cast<int64_t>(x); };
  if (n < 2) throw Error(detail::concat("a step result of ", n, " values"));
  if (!whole(v[0], micro_batches, micro_batches))
    throw Error(detail::concat("a step result of ", v[0], " losses for ", micro_batches, " micro-batches"));
  if (!whole(v[1], 0, static_cast<double>(n)))
    throw Error(detail::concat("a step result claiming ", v[1], " spans in ", n, " values"));
  const int64_t spans = static_cast<int64_t>(v[1]);
  if (n != 2 + micro_batches + 2 + kSpanFields * spans)
    throw Error(detail::concat("a step result of ", n, " values for ", micro_batches, " losses and ", spans, " spans"));
  StepResult r;
  const double* p = v + 2;
  r.losses.assign(p, p + micro_batches);
  p += micro_batches;
  if (!whole(p[0], 0, 1 << 30) || !whole(p[1], 0, 1 << 30))
    throw Error(detail::concat("a step result with peaks ", p[0], " and ", p[1]));
  r.peak_in_flight = static_cast<int>(p[0]);
  r.peak_awaiting_weight = static_cast<int>(p[1]);
  p += 2;
  for (int64_t i = 0; i < spans; ++i, p += kSpanFields) {
    if (!whole(p[0], 0, static_cast<int>(schedule::Op::Reduce)))
      throw Error(detail::concat("a step result with an unknown action code ", p[0]));
    if (!whole(p[1], -1, 1 << 30) || !whole(p[2], 0, 1 << 30))
      throw Error(detail::concat("a step result with micro-batch ", p[1], " chunk ", p[2]));
    r.spans.push_back({static_cast<schedule::Op>(static_cast<int>(p[0])), static_cast<int>(p[1]), static_cast<int>(p[2]),
                       p[3], p[4], p[5]});
  }
  return r;
}

}  // namespace pipetrain::pipeline
