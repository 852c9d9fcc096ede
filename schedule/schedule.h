// schedule: the order of work in a pipeline step, as data. A schedule is a pure function
// (kind, stages, micro-batches, chunks) -> one action list per stage (device); the executor runs
// the list and never decides order itself. validate() proves a list set complete and
// deadlock-free by running it against unbounded mailboxes; simulate() (simulate.h) runs the
// same lists against a cost table. Nothing here depends on libtorch.
//
// Virtual stages. With `chunks` = v > 1 the model is cut into K·v virtual stages. In the loop
// placement (interleaved-1f1b, looped-bfs) device r holds virtual stages r, r + K, r + 2K, ...
// (chunk c of device r is virtual stage c·K + r), so activations flow from virtual stage s to
// s + 1 on the next device, wrapping from the last device back to the first. In the V placement
// (zb-v, dualpipev; two chunks) device r holds virtual stages r and 2K−1−r: activations go down
// the devices through chunk 0, turn on the last device (which holds K−1 and K, handed over
// without a transfer) and come back up through chunk 1, so the loss is on device 0. Gradients
// flow back the same way.
#pragma once

#include <string>
#include <vector>

#include "schedule/kinds.h"

/// Schedules as per-stage action lists, their checks, the simulator's inputs and traces.
namespace pipetrain::schedule {

/// What one action of a stage does.
enum class Op {
  RecvActivation,  ///< receive the micro-batch's input from the previous virtual stage
  Forward,
  SendActivation,  ///< send the forward output to the next virtual stage
  RecvGrad,        ///< receive the gradient of this stage's output from the next virtual stage
  Backward,        ///< fused backward: (recompute if recomputed and) input and weight gradients
  BackwardInput,   ///< B: the input gradient only; keeps what W needs
  BackwardWeight,  ///< W: the weight gradients, from what B kept, without redoing B's work
  SendGrad,        ///< send the gradient of this stage's input to the previous virtual stage
  /// Data parallelism: start reducing this virtual stage's gradients across its replicas (right
  /// after its last backward part, micro_batch -1). It runs beside the actions after it; the
  /// optimizer steps once it has finished.
  Reduce,
};

/// One step of a device's list.
struct Action {
  Op op;            ///< what to do
  int micro_batch;  ///< for which micro-batch (-1: a reduction)
  int chunk = 0;  ///< which of this device's virtual stages; 0 when not interleaved

  /// Same op, micro-batch and chunk.
  bool operator==(const Action& o) const {
    return op == o.op && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};

/// The op's name as traces and errors print it.
const char* op_name(Op op);
/// "Forward(mb 3, chunk 1)": the action as errors and dumps print it.
std::string to_string(const Action& a);
bool is_compute(Op op);  ///< Forward, Backward, BackwardInput, BackwardWeight

/// A schedule as data: the ordered actions of every device.
struct Schedule {
  Kind kind = Kind::GPipe;  ///< the schedule kind (kinds.h)
  int stages = 0;  ///< devices
  int micro_batches = 0;  ///< per batch
  int chunks = 1;  ///< virtual stages per device
  std::vector<std::vector<Action>> actions;  ///< actions[stage]
  Placement placement = Placement::Loop;  ///< how virtual stages sit on devices
  bool reduces = false;  ///< with_reductions(): one Reduce per virtual stage
  bool forward_only = false;  ///< forward_only(): an evaluation, with no backward

  int virtual_stages() const { return stages * chunks; }  ///< stages times chunks
  /// The virtual stage that chunk `chunk` of device `stage` runs.
  int virtual_stage(int stage, int chunk) const {
    return chunk * stages + (placement == Placement::V && chunk % 2 ? stages - 1 - stage : stage);
  }
  /// The device that runs a virtual stage.
  int device_of(int virtual_stage) const {
    const int d = virtual_stage % stages;
    return placement == Placement::V && chunk_of(virtual_stage) % 2 ? stages - 1 - d : d;
  }
  int chunk_of(int virtual_stage) const { return virtual_stage / stages; }  ///< its chunk on its device
};

/// Builds the kind's schedule (its row's builder, kinds.h); throws ScheduleError for sizes it
/// cannot serve.
Schedule make_schedule(Kind kind, int stages, int micro_batches, int chunks = 1);

/// GPipe fill-drain: all forwards in micro-batch order, then all backwards in reverse order.
Schedule make_gpipe(int stages, int micro_batches);
/// 1F1B (PipeDream-flush): K-r-1 warm-up forwards on stage r, then one forward one backward.
Schedule make_1f1b(int stages, int micro_batches);
/// Interleaved 1F1B (Megatron-LM): v chunks per device, micro-batches in groups of K.
Schedule make_interleaved_1f1b(int stages, int micro_batches, int chunks);
/// ZB-H1 (zero bubble, same activation memory as 1F1B): 1F1B with the backward split into B and
/// W; stage r holds back r W passes, so Bs reach the first stage sooner and the held-back Ws fill
/// the drain. With equal costs and M >= K its bubble is (K-1)(F+B-W) per stage.
Schedule make_zb_h1(int stages, int micro_batches);

/// ZB-H2 (zero bubble with about twice 1F1B's activation memory): stage r runs 2(K−r)−1 warm-up
/// forwards, then B, W, F per micro-batch while holding back 2r W passes, which it runs after its
/// last B. With costs F, B, W and transfer c, every stage's span (first action to last) is
/// M(F+B+W) + (K−1)(F+B−2W+2c), the zero-bubble paper's figure (its Table 5).
Schedule make_zb_h2(int stages, int micro_batches);
/// Looped BFS (breadth-first, as in torch.distributed.pipelining): every chunk of a device runs all
/// its micro-batches' forwards, chunk by chunk, then the backwards, last chunk first.
Schedule make_looped_bfs(int stages, int micro_batches, int chunks);
/// DualPipeV (DeepSeek): V placement; after its warm-up, each device pairs the forward of one
/// micro-batch with the backward of another (listed one after the other: the executor runs them in
/// turn), and the last micro-batches' backwards are split to fill the drain. Needs M >= 2K.
Schedule make_dualpipev(int stages, int micro_batches);

/// An evaluation's lists: forwards only, for `micro_batches` micro-batches on the devices,
/// chunks and placement of `shape`. Each device takes the micro-batches in order and, within
/// one, its chunks in order (receive, forward, send), so no device waits on a later micro-batch
/// and the order is the same under in-order delivery. Pipeline::predict runs these through the
/// training step's executor.
Schedule forward_only(const Schedule& shape, int micro_batches);

/// `s` with a Reduce action (data parallelism) for each virtual stage right after its last
/// backward part (fused backward or W) on its device.
Schedule with_reductions(Schedule s);

/// The schedule a pipeline runs: make_schedule()'s lists, with_reductions() when
/// `data_parallel` > 1 copies reduce their gradients. Pipelines build theirs here, and so do
/// `plan` and `plan --auto`, so that what the planner simulates is what runs (zb-auto included,
/// searched on equal costs: a pipeline has no profile).
Schedule pipeline_schedule(Kind kind, int stages, int micro_batches, int chunks, int data_parallel);

/// Checks that every (micro-batch, chunk) gets one forward and one backward (fused, or B then W;
/// a forward_only schedule has none) on its device, that each compute has its input (received or local) before it runs, that every
/// send has a matching receive, and that the lists complete without deadlock. Throws
/// ScheduleError naming stage and action.
void validate(const Schedule& s);

}  // namespace pipetrain::schedule
