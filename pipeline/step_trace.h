// step_trace: what the executor measured in one step (spans of every action on every stage),
// and the two uses of it: a timeline in the Chrome trace format (schedule/trace.h), and the
// per-op costs that let the simulator predict the same step (schedule/simulate.h).
#pragma once

#include <cstdint>
#include <vector>

#include "schedule/simulate.h"
#include "schedule/trace.h"

namespace pipetrain::pipeline {

/// One executed action: times are seconds since the step began.
struct Span {
  schedule::Op op;   ///< the action
  int micro_batch;   ///< its micro-batch (-1 for a reduction)
  int chunk;         ///< its chunk on the device
  double start;      ///< seconds since the step began
  double end;        ///< seconds since the step began
  double recompute = 0;  ///< seconds at the start of a backward spent re-running the forward
};

/// What the executor measured in one step.
struct StepTrace {
  int64_t step = 0;                      ///< the pipeline step
  double start = 0;                      ///< seconds from the pipeline's creation to the step's start
  double wall = 0;                       ///< seconds the step took
  std::vector<std::vector<Span>> spans;  ///< spans[stage]
  std::vector<std::pair<double, double>> optimizer;  ///< per stage: its optimizer step, once every stage has run its list
  /// Per stage (device): the most micro-batches whose activations were held at once (forward
  /// done, backward or backward_input not), and the most awaiting their weight gradients.
  std::vector<int> peak_in_flight;
  std::vector<int> peak_awaiting_weight;  ///< see peak_in_flight
};

/// The step's spans as a timeline in milliseconds from `origin_s` (seconds on the same clock as
/// StepTrace::start); a backward that recomputed becomes a "recompute" span and a "backward" one.
std::vector<std::vector<schedule::TraceSpan>> timeline(const StepTrace& t, double origin_s);

/// Per stage: milliseconds of compute (forward, backward, B, W, recompute) and optimizer step.
std::vector<double> stage_busy_ms(const StepTrace& t);

/// Idle share of stage time: 1 - busy / (stages · wall), busy as stage_busy_ms counts it (and as
/// the simulator counts it).
double bubble(const StepTrace& t);

/// Median measured cost of each op on each virtual stage, for simulate(): the micro-batches that
/// recomputed are marked recomputed; send_ms is the median send span; latency_ms the median
/// time from a send's end to the end of a receive that was waiting for it (bandwidth is left
/// unlimited: the local transport passes tensors by reference); action_ms the executor's own
/// time between actions (the gaps between spans, averaged over the actions); finish_ms each
/// stage's optimizer step.
schedule::Costs measured_costs(const StepTrace& t, const schedule::Schedule& s);

}  // namespace pipetrain::pipeline
