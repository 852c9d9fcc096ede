// trace: per-stage timelines in the Chrome trace event format, which Perfetto
// (ui.perfetto.dev) and chrome://tracing open. The executor's measured spans and the
// simulator's predicted spans are written the same way, so the two can be compared by eye.
// Gaps between a stage's spans are written as "idle". Nothing here depends on libtorch.
#pragma once

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "schedule/schedule.h"

namespace pipetrain::schedule {

/// One span of a timeline row.
struct TraceSpan {
  std::string name;      ///< "forward", "backward", "recompute", "send_activation", ...
  int micro_batch = -1;  ///< -1: not about one micro-batch
  int chunk = 0;         ///< the device's chunk
  int64_t step = 0;      ///< the training step
  double start_ms = 0;   ///< from the timeline's origin
  double end_ms = 0;     ///< from the timeline's origin
};

/// A process row of a Chrome trace: one row per stage.
struct TraceTimeline {
  std::string title;                          ///< names the process row, e.g. "measured" or "simulated gpipe"
  std::vector<std::vector<TraceSpan>> spans;  ///< spans[stage], in time order
  /// Optional counters beside the spans, per stage: (ms, value) at each change, drawn as a graph
  /// named `counter_name` (e.g. the simulator's activation memory).
  std::string counter_name;
  std::vector<std::vector<std::pair<double, double>>> counters;  ///< counters[stage]
};

struct Simulation;
/// A simulated step (simulate.h) as a timeline: its spans (the finishing work as "optimizer") and
/// each device's activation memory as counters.
TraceTimeline simulated_timeline(const Simulation& sim, std::string title);

/// Writes one JSON object {"traceEvents": [...]} with a process per timeline and a thread per
/// stage. Spans shorter than `min_idle_ms` between two others are not reported as idle.
void write_chrome_trace(std::ostream& out, const std::vector<TraceTimeline>& timelines,
                        double min_idle_ms = 0.001);

}  // namespace pipetrain::schedule
