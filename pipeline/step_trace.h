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
  /// Per stage: the minor page faults its worker thread took running its list (first touches of
  /// freshly mapped memory: new tensors the allocator had to map); -1 for another process's stage.
  std::vector<int64_t> page_faults;
  /// Per stage: the times its device context read results back to the host or waited for its
  /// device (stages::DeviceContext::host_reads) while the list's actions ran, the step's one
  /// read of the losses after them not counted; -1 for another process's stage. 0 wherever the
  /// device's work is queued without the host waiting for it.
  std::vector<int64_t> host_reads;
  /// Per stage: the forwards (with their backwards) that ran from CUDA graphs
  /// (PipelineOptions::cuda_graphs); -1 for another process's stage.
  std::vector<int> graphed;
};

/// One stage's step in parts, in seconds. The parts tile the stage's timeline from the step's
/// start to its end (every instant belongs to exactly one), so they add up to StepTrace::wall.
struct StageBreakdown {
  double forward = 0;          ///< forward spans
  double backward = 0;         ///< full backward spans, less their recomputation
  double backward_input = 0;   ///< input-gradient (B) spans, less their recomputation
  double backward_weight = 0;  ///< weight-gradient (W) spans
  double recompute = 0;    ///< the forwards re-run at the start of backwards (taken out of backward)
  double wait_input = 0;   ///< receiving an activation: waiting for the stage before
  double wait_grad = 0;    ///< receiving a gradient: waiting for the stage after
  double send = 0;         ///< handing an activation or gradient to the transport
  double between = 0;      ///< the executor's own time between actions (bookkeeping, wake-ups)
  double reduce_wait = 0;  ///< after the list, waiting for data-parallel reductions to finish
  double idle_start = 0;   ///< from the step's start to the stage's first action
  double end_wait = 0;     ///< after the list, waiting for every other stage before the optimizers
  double optimizer = 0;    ///< its optimizer step
  double idle_end = 0;     ///< from its optimizer step's end to the step's end (the slowest optimizer)
  int64_t page_faults = -1;  ///< StepTrace::page_faults

  /// Forward, backward, B, W and recomputation together.
  double compute() const { return forward + backward + backward_input + backward_weight + recompute; }
  /// Every part: the stage's step, which is StepTrace::wall.
  double total() const {
    return compute() + wait_input + wait_grad + send + between + reduce_wait + idle_start + end_wait + optimizer + idle_end;
  }
};

/// The breakdown of each stage of a step (see StageBreakdown).
std::vector<StageBreakdown> breakdown(const StepTrace& t);

/// What one rank ran in a step, as the ranks of a multi-process pipeline exchange it at the
/// step's end (the exchange doubles as the barrier before any optimizer steps): its device's
/// micro-batch losses (those of the last stage count), its peaks and its spans, so that every
/// rank's loss and rank 0's trace cover every stage.
struct StepResult {
  std::vector<double> losses;    ///< per micro-batch, as this rank computed them (zeros off the last stage)
  int peak_in_flight = 0;        ///< StepTrace::peak_in_flight of this rank's device
  int peak_awaiting_weight = 0;  ///< StepTrace::peak_awaiting_weight of this rank's device
  std::vector<Span> spans;       ///< StepTrace::spans of this rank's device
};

/// The result as numbers for the control plane: a count of losses and of spans, the losses, the
/// two peaks, then six numbers per span.
std::vector<double> encode_step_result(const StepResult& r);
/// The inverse of encode_step_result for a step of `micro_batches` micro-batches. Throws Error
/// saying what is wrong (its length, a count, an unknown action code) when the numbers are not
/// such a result; nothing a peer sends makes it read out of bounds or allocate beyond `n`.
StepResult decode_step_result(const double* v, int64_t n, int micro_batches);

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
