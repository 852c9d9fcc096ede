#include "pipeline/step_trace.h"

#include <algorithm>
#include <map>
#include <tuple>

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

namespace {
}  // namespace

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

schedule::Costs measured_costs(const StepTrace& t, const schedule::Schedule& s) {
  const int V = s.virtual_stages();
  std::vector<std::vector<double>> fwd(V), bin(V), fused(V), bw(V), rec(V), red(V);
  std::vector<double> sends;
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
        case Op::BackwardWeight: bw[vs].push_back(ms); break;
        case Op::SendActivation:
        case Op::SendGrad: sends.push_back(ms); break;
        default: break;
      }
    }
  }
  c.send_ms = median(sends);
  // Delivery latency: for each receive that had to wait, from the end of the matching send to
  // the end of the receive (the wake-up of the waiting stage).
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
  c.latency_ms = median(latency);
  c.finish_ms.assign(s.stages, 0.0);
  for (size_t r = 0; r < t.optimizer.size() && r < c.finish_ms.size(); ++r)
    c.finish_ms[r] = (t.optimizer[r].second - t.optimizer[r].first) * 1e3;
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

}  // namespace pipetrain::pipeline
