#include "pipeline/step_trace.h"

#include <algorithm>

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
  return out;
}

namespace {
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

schedule::Costs measured_costs(const StepTrace& t, const schedule::Schedule& s) {
  const int V = s.virtual_stages();
  std::vector<std::vector<double>> fwd(V), bin(V), bw(V), rec(V);
  schedule::Costs c = schedule::Costs::uniform(V, 0, 0, 0);
  c.checkpointed.assign(s.micro_batches, false);
  for (size_t r = 0; r < t.spans.size(); ++r)
    for (const Span& sp : t.spans[r]) {
      const int vs = s.virtual_stage(static_cast<int>(r), sp.chunk);
      const double ms = (sp.end - sp.start) * 1e3, rc = sp.recompute * 1e3;
      switch (sp.op) {
        case Op::Forward: fwd[vs].push_back(ms); break;
        case Op::Backward:
        case Op::BackwardInput:
          bin[vs].push_back(ms - rc);
          if (rc > 0) {
            rec[vs].push_back(rc);
            c.checkpointed[sp.micro_batch] = true;
          }
          break;
        case Op::BackwardWeight: bw[vs].push_back(ms); break;
        default: break;
      }
    }
  for (int v = 0; v < V; ++v) {
    c.forward[v] = median(fwd[v]);
    c.backward_input[v] = median(bin[v]);
    c.backward_weight[v] = median(bw[v]);
    c.recompute[v] = median(rec[v]);
  }
  return c;
}

}  // namespace pipetrain::pipeline
