// schedule: the order of work in a pipeline step, as data. A schedule is a pure function
// (kind, stages, micro-batches, chunks) -> one action list per stage (device); the executor runs
// the list and never decides order itself. validate() proves a list set complete and
// deadlock-free by running it against unbounded mailboxes; simulate() (simulate.h) runs the
// same lists against a cost table. Nothing here depends on libtorch.
//
// Virtual stages. With `chunks` = v > 1 (interleaved schedules) the model is cut into K·v
// virtual stages and device r holds virtual stages r, r + K, r + 2K, ... (chunk c of device r is
// virtual stage c·K + r). Activations flow from virtual stage s to s + 1, which is on the next
// device (wrapping from the last device back to the first), and gradients flow back.
#pragma once

#include <string>
#include <vector>

namespace pipetrain::schedule {

enum class Op {
  RecvActivation,  // receive the micro-batch's input from the previous virtual stage
  Forward,
  SendActivation,  // send the forward output to the next virtual stage
  RecvGrad,        // receive the gradient of this stage's output from the next virtual stage
  Backward,        // fused backward: (recompute if recomputed and) input and weight gradients
  BackwardInput,   // B: the input gradient only; keeps what W needs
  BackwardWeight,  // W: the weight gradients, from what B kept, without redoing B's work
  SendGrad,        // send the gradient of this stage's input to the previous virtual stage
};

struct Action {
  Op op;
  int micro_batch;
  int chunk = 0;  // which of this device's virtual stages; 0 when not interleaved

  bool operator==(const Action& o) const {
    return op == o.op && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};

const char* op_name(Op op);
std::string to_string(const Action& a);
bool is_compute(Op op);  // Forward, Backward, BackwardInput, BackwardWeight

struct Schedule {
  std::string kind;
  int stages = 0;  // devices
  int micro_batches = 0;
  int chunks = 1;  // virtual stages per device
  std::vector<std::vector<Action>> actions;  // actions[stage]

  int virtual_stages() const { return stages * chunks; }
  int virtual_stage(int stage, int chunk) const { return chunk * stages + stage; }
  int device_of(int virtual_stage) const { return virtual_stage % stages; }
  int chunk_of(int virtual_stage) const { return virtual_stage / stages; }
};

// The schedule kinds this build knows: gpipe, 1f1b, interleaved-1f1b, zb-h1.
std::vector<std::string> schedule_kinds();

// Whether a kind runs several chunks per device (interleaved-1f1b) and its default chunk count.
bool uses_chunks(const std::string& kind);

// Throws ScheduleError naming what would work when the kind cannot serve these sizes (e.g.
// interleaved-1f1b needs chunks >= 2 and a micro-batch count that is a multiple of the stages).
void check_supported(const std::string& kind, int stages, int micro_batches, int chunks);

// Builds the named schedule; throws ScheduleError for an unknown kind or sizes it cannot serve.
Schedule make_schedule(const std::string& kind, int stages, int micro_batches, int chunks = 1);

// GPipe fill-drain: all forwards in micro-batch order, then all backwards in reverse order.
Schedule make_gpipe(int stages, int micro_batches);
// 1F1B (PipeDream-flush): K-r-1 warm-up forwards on stage r, then one forward one backward.
Schedule make_1f1b(int stages, int micro_batches);
// Interleaved 1F1B (Megatron-LM): v chunks per device, micro-batches in groups of K.
Schedule make_interleaved_1f1b(int stages, int micro_batches, int chunks);
// ZB-H1 (zero bubble, same activation memory as 1F1B): 1F1B with the backward split into B and
// W; stage r holds back r W passes, so Bs reach the first stage sooner and the held-back Ws fill
// the drain. With equal costs and M >= K its bubble is (K-1)(F+B-W) per stage.
Schedule make_zb_h1(int stages, int micro_batches);

// Checks that every (micro-batch, chunk) gets one forward and one backward (fused, or B then W)
// on its device, that each compute has its input (received or local) before it runs, that every
// send has a matching receive, and that the lists complete without deadlock. Throws
// ScheduleError naming stage and action.
void validate(const Schedule& s);

}  // namespace pipetrain::schedule
