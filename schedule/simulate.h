// simulate: runs a schedule's action lists against a cost table, as a discrete-event model of
// the executor. Each device runs its list in order; a compute takes its cost; a send costs the
// sender nothing and delivers after latency + bytes / bandwidth (nothing between chunks of one
// device); a receive waits for delivery. Optional per-send and per-action overheads model the
// executor's own time. The result is the makespan, the bubble (idle share of
// the devices' time), each device's span, peak number of micro-batches in flight, activation
// memory over time and the timeline.
//
// Memory: a micro-batch holds Costs::saved_bytes[vs] on its device from its forward on virtual
// stage vs to its last backward part there (the fused backward, or W); a recomputed one holds
// only its input (the previous virtual stage's activation_bytes) in between. Between a B and its
// W it also holds Costs::awaiting_weight_bytes[vs].
//
// Reductions (Op::Reduce, data parallelism) cost the device only action_ms to start; they run
// on the device's link, one after another, and the step (and its finishing work) ends once
// every reduction has. Without
// saved_bytes, each held micro-batch chunk counts 1.
// Nothing here depends on libtorch.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "schedule/schedule.h"

namespace pipetrain::schedule {

// Per virtual stage (size stages·chunks), milliseconds for one micro-batch.
struct Costs {
  std::vector<double> forward;
  std::vector<double> backward_input;   // B: the input-gradient part of the backward
  std::vector<double> backward_weight;  // W: the weight-gradient part; a fused backward costs B + W
  std::vector<double> backward_fused;   // a fused backward where known apart (negative or empty: B + W)
  std::vector<double> recompute;        // extra forward in the backward of a recomputed micro-batch
  std::vector<bool> recomputed;        // per micro-batch; empty: none is recomputed
  std::vector<double> activation_bytes;  // the output of each virtual stage (its gradient is as large)
  std::vector<double> saved_bytes;       // what a micro-batch keeps on each virtual stage for its backward; empty: count 1
  // What a micro-batch holds besides saved_bytes from its B to its W on each virtual stage (the
  // output gradients its weight gradients need); empty: nothing.
  std::vector<double> awaiting_weight_bytes;
  double latency_ms = 0;
  double bytes_per_ms = 0;  // transfer bandwidth; 0: unlimited
  // Per device: its own bandwidth (a transfer runs at the slower end's); empty: bytes_per_ms.
  std::vector<double> device_bytes_per_ms;
  double send_ms = 0;       // the sender's own time per send (posting it, encoding the header)
  double action_ms = 0;     // bookkeeping the executor spends around every action
  std::vector<double> finish_ms;  // per device: work once every device has run its list (the optimizer step); empty: none
  // Per device: work right after its own last action, before the finishing work (the flush of
  // deferred weight gradients, pipeline/executor.cpp); empty: none.
  std::vector<double> tail_ms;
  // Per virtual stage: its Reduce (data parallelism), which runs on the device's link beside
  // the later actions, one reduction at a time; the finishing work waits for it. Empty: free.
  std::vector<double> reduce_ms;

  // Equal costs on every virtual stage, no recomputation, free transfers.
  static Costs uniform(int virtual_stages, double forward, double backward_input, double backward_weight);
};

// One simulated action, in milliseconds from the step's start.
struct SimSpan {
  Op op;
  int micro_batch, chunk;
  double start, end;
  bool finish = false;  // the device's work after its last action (Costs::tail_ms, finish_ms), not `op`
};

struct Simulation {
  double makespan_ms = 0;
  double bubble = 0;                    // 1 - (sum of compute time) / (stages · makespan)
  std::vector<double> busy_ms;          // per device: compute time, including tail_ms and finish_ms
  std::vector<int> peak_in_flight;      // per device: most micro-batches between forward and backward(_input)
  std::vector<int> peak_awaiting_weight;  // per device: most micro-batches between forward and their last backward part
  std::vector<double> span_ms;           // per device: from its first compute's start to its last compute's end
  std::vector<double> peak_memory;       // per device: most activation memory held (bytes, or chunks without saved_bytes)
  std::vector<std::vector<std::pair<double, double>>> memory;  // per device: (ms, held) at each change
  std::vector<std::vector<SimSpan>> spans;  // spans[device], in list order
  std::vector<double> exposed_reduce_ms;   // per device: how long its reductions outlast every device's last action
};

// Throws ScheduleError when the cost table does not fit the schedule or the lists deadlock.
Simulation simulate(const Schedule& s, const Costs& costs);

}  // namespace pipetrain::schedule
