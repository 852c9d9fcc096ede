#include "schedule/schedule.h"

#include <deque>
#include <map>
#include <set>
#include <tuple>

#include "common/error.h"

namespace pipetrain::schedule {

const char* op_name(Op op) {
  switch (op) {
    case Op::RecvActivation: return "recv_activation";
    case Op::Forward: return "forward";
    case Op::SendActivation: return "send_activation";
    case Op::RecvGrad: return "recv_grad";
    case Op::Backward: return "backward";
    case Op::SendGrad: return "send_grad";
  }
  return "?";
}

std::string to_string(const Action& a) {
  return detail::concat(op_name(a.op), "(mb ", a.micro_batch, a.chunk ? detail::concat(", chunk ", a.chunk) : "", ")");
}

std::vector<std::string> schedule_kinds() { return {"gpipe"}; }

namespace {
void check_sizes(int stages, int micro_batches) {
  if (stages < 1) throw ScheduleError(detail::concat("schedule: stages must be >= 1, got ", stages));
  if (micro_batches < 1)
    throw ScheduleError(detail::concat("schedule: micro_batches must be >= 1, got ", micro_batches));
}
}  // namespace

Schedule make_gpipe(int stages, int micro_batches) {
  check_sizes(stages, micro_batches);
  Schedule s{"gpipe", stages, micro_batches, std::vector<std::vector<Action>>(stages)};
  for (int r = 0; r < stages; ++r) {
    auto& list = s.actions[r];
    const bool first = r == 0, last = r == stages - 1;
    for (int m = 0; m < micro_batches; ++m) {
      if (!first) list.push_back({Op::RecvActivation, m});
      list.push_back({Op::Forward, m});
      if (!last) list.push_back({Op::SendActivation, m});
    }
    for (int m = micro_batches - 1; m >= 0; --m) {
      if (!last) list.push_back({Op::RecvGrad, m});
      list.push_back({Op::Backward, m});
      if (!first) list.push_back({Op::SendGrad, m});
    }
  }
  return s;
}

Schedule make_schedule(const std::string& kind, int stages, int micro_batches) {
  if (kind == "gpipe") return make_gpipe(stages, micro_batches);
  throw ScheduleError("schedule: unknown kind '" + kind + "' (known: gpipe)");
}

namespace {

// Per-stage bookkeeping while checking one list in isolation.
struct StageState {
  std::set<int> received_act, forwarded, sent_act, received_grad, backwarded, sent_grad;
};

[[noreturn]] void fail(int stage, size_t index, const Action& a, const std::string& why) {
  throw ScheduleError(detail::concat("schedule: stage ", stage, " action ", index, " ",
                                     to_string(a), ": ", why));
}

void check_local_order(const Schedule& s, int r) {
  const bool first = r == 0, last = r == s.stages - 1;
  StageState st;
  const auto& list = s.actions[r];
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    const int m = a.micro_batch;
    if (m < 0 || m >= s.micro_batches) fail(r, i, a, "micro-batch out of range");
    if (a.chunk != 0) fail(r, i, a, "chunks are not supported by this schedule");
    auto once = [&](std::set<int>& done) {
      if (!done.insert(m).second) fail(r, i, a, "repeated");
    };
    switch (a.op) {
      case Op::RecvActivation:
        if (first) fail(r, i, a, "the first stage has no previous stage");
        once(st.received_act);
        break;
      case Op::Forward:
        if (!first && !st.received_act.count(m)) fail(r, i, a, "input not received yet");
        once(st.forwarded);
        break;
      case Op::SendActivation:
        if (last) fail(r, i, a, "the last stage has no next stage");
        if (!st.forwarded.count(m)) fail(r, i, a, "sent before its forward");
        once(st.sent_act);
        break;
      case Op::RecvGrad:
        if (last) fail(r, i, a, "the last stage has no next stage");
        once(st.received_grad);
        break;
      case Op::Backward:
        if (!st.forwarded.count(m)) fail(r, i, a, "backward before its forward");
        if (!last && !st.received_grad.count(m)) fail(r, i, a, "output gradient not received yet");
        once(st.backwarded);
        break;
      case Op::SendGrad:
        if (first) fail(r, i, a, "the first stage has no previous stage");
        if (!st.backwarded.count(m)) fail(r, i, a, "sent before its backward");
        once(st.sent_grad);
        break;
    }
  }
  for (int m = 0; m < s.micro_batches; ++m) {
    auto missing = [&](const std::set<int>& done, const char* what) {
      if (!done.count(m))
        throw ScheduleError(detail::concat("schedule: stage ", r, " never runs ", what,
                                           " for micro-batch ", m));
    };
    missing(st.forwarded, "forward");
    missing(st.backwarded, "backward");
    if (!first) missing(st.received_act, "recv_activation"), missing(st.sent_grad, "send_grad");
    if (!last) missing(st.sent_act, "send_activation"), missing(st.received_grad, "recv_grad");
  }
}

// Runs every list against unbounded mailboxes: sends never block, a receive blocks until its
// message was sent. If no stage can move while some still have actions, the lists deadlock.
void check_progress(const Schedule& s) {
  using Key = std::tuple<int, int, int>;  // (destination, kind, micro-batch)
  std::set<Key> mailbox;
  std::vector<size_t> pc(s.stages, 0);
  size_t remaining = 0;
  for (const auto& l : s.actions) remaining += l.size();
  while (remaining > 0) {
    bool moved = false;
    for (int r = 0; r < s.stages; ++r) {
      while (pc[r] < s.actions[r].size()) {
        const Action& a = s.actions[r][pc[r]];
        if (a.op == Op::RecvActivation || a.op == Op::RecvGrad) {
          Key k{r, static_cast<int>(a.op), a.micro_batch};
          if (!mailbox.erase(k)) break;
        } else if (a.op == Op::SendActivation) {
          mailbox.insert({r + 1, static_cast<int>(Op::RecvActivation), a.micro_batch});
        } else if (a.op == Op::SendGrad) {
          mailbox.insert({r - 1, static_cast<int>(Op::RecvGrad), a.micro_batch});
        }
        ++pc[r];
        --remaining;
        moved = true;
      }
    }
    if (!moved) {
      std::string blocked;
      for (int r = 0; r < s.stages; ++r)
        if (pc[r] < s.actions[r].size())
          blocked += detail::concat(blocked.empty() ? "" : ", ", "stage ", r, " at ",
                                    to_string(s.actions[r][pc[r]]));
      throw ScheduleError("schedule: deadlock: " + blocked);
    }
  }
  if (!mailbox.empty()) throw ScheduleError("schedule: a message is sent but never received");
}

}  // namespace

void validate(const Schedule& s) {
  if (s.stages < 1 || static_cast<int>(s.actions.size()) != s.stages)
    throw ScheduleError(detail::concat("schedule: expected ", s.stages, " action lists, got ",
                                       s.actions.size()));
  for (int r = 0; r < s.stages; ++r) check_local_order(s, r);
  check_progress(s);
}

}  // namespace pipetrain::schedule
