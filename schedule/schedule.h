// schedule: the order of work in a pipeline step, as data. A schedule is a pure function
// (kind, stages, micro-batches) -> one action list per stage; the executor runs the list and
// never decides order itself. validate() proves a list set complete and deadlock-free by
// running it against unbounded mailboxes. Nothing here depends on libtorch.
#pragma once

#include <string>
#include <vector>

namespace pipetrain::schedule {

enum class Op {
  RecvActivation,  // receive the micro-batch's input from the previous stage
  Forward,
  SendActivation,  // send the forward output to the next stage
  RecvGrad,        // receive the gradient of this stage's output from the next stage
  Backward,        // (recompute if checkpointed and) backpropagate through the stage
  SendGrad,        // send the gradient of this stage's input to the previous stage
};

struct Action {
  Op op;
  int micro_batch;
  int chunk = 0;  // virtual stage on this device; 0 for non-interleaved schedules

  bool operator==(const Action& o) const {
    return op == o.op && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};

const char* op_name(Op op);
std::string to_string(const Action& a);

struct Schedule {
  std::string kind;
  int stages = 0;
  int micro_batches = 0;
  std::vector<std::vector<Action>> actions;  // actions[stage]
};

// The schedule kinds this build knows.
std::vector<std::string> schedule_kinds();

// Builds the named schedule; throws ScheduleError for an unknown kind or bad sizes.
Schedule make_schedule(const std::string& kind, int stages, int micro_batches);

// GPipe fill-drain: all forwards in micro-batch order, then all backwards in reverse order.
Schedule make_gpipe(int stages, int micro_batches);

// Checks that every stage runs Forward and Backward once per micro-batch, that each compute
// has its input (received or local) before it runs, that every send has a matching receive,
// and that the lists complete without deadlock. Throws ScheduleError naming stage and action.
void validate(const Schedule& s);

}  // namespace pipetrain::schedule
