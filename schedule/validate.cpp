// validate(): the checks of schedule.h's contract on an action list set.
#include <set>
#include <tuple>

#include "common/error.h"
#include "common/strings.h"
#include "schedule/schedule.h"

namespace pipetrain::schedule {

namespace {

// Per-stage bookkeeping while checking one list in isolation, keyed by (micro-batch, chunk).
using Key = std::pair<int, int>;
struct StageState {
  std::set<Key> received_act, forwarded, sent_act, received_grad, fused, input_done, weight_done,
      sent_grad;
  std::set<int> reduced;  // chunks
};

[[noreturn]] void fail(int stage, size_t index, const Action& a, const std::string& why) {
  throw ScheduleError(detail::concat("schedule: stage ", stage, " action ", index, " ",
                                     to_string(a), ": ", why));
}

void check_local_order(const Schedule& s, int r) {
  StageState st;
  const auto& list = s.actions[r];
  const int V = s.virtual_stages();
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    if (a.op == Op::Reduce) {
      if (!s.reduces) fail(r, i, a, "a reduction in a schedule without data parallelism");
      if (a.chunk < 0 || a.chunk >= s.chunks) fail(r, i, a, "chunk out of range");
      for (int m = 0; m < s.micro_batches; ++m)
        if (!st.fused.count({m, a.chunk}) && !st.weight_done.count({m, a.chunk}))
          fail(r, i, a, detail::concat("before the last backward part of micro-batch ", m));
      if (!st.reduced.insert(a.chunk).second) fail(r, i, a, "repeated");
      continue;
    }
    if (a.micro_batch < 0 || a.micro_batch >= s.micro_batches) fail(r, i, a, "micro-batch out of range");
    if (a.chunk < 0 || a.chunk >= s.chunks) fail(r, i, a, "chunk out of range");
    const Key k{a.micro_batch, a.chunk};
    const int vs = s.virtual_stage(r, a.chunk);
    const bool first = vs == 0, last = vs == V - 1;
    auto once = [&](std::set<Key>& done) {
      if (!done.insert(k).second) fail(r, i, a, "repeated");
    };
    const bool backwarded = st.fused.count(k) || st.input_done.count(k);
    if (s.forward_only && a.op != Op::RecvActivation && a.op != Op::Forward && a.op != Op::SendActivation)
      fail(r, i, a, "a forward-only schedule has no backward");
    switch (a.op) {
      case Op::RecvActivation:
        if (first) fail(r, i, a, "the first stage has no previous stage");
        once(st.received_act);
        break;
      case Op::Forward:
        if (!first && !st.received_act.count(k)) fail(r, i, a, "input not received yet");
        once(st.forwarded);
        break;
      case Op::SendActivation:
        if (last) fail(r, i, a, "the last stage has no next stage");
        if (!st.forwarded.count(k)) fail(r, i, a, "sent before its forward");
        once(st.sent_act);
        break;
      case Op::RecvGrad:
        if (last) fail(r, i, a, "the last stage has no next stage");
        once(st.received_grad);
        break;
      case Op::Backward:
      case Op::BackwardInput:
        if (!st.forwarded.count(k)) fail(r, i, a, "backward before its forward");
        if (!last && !st.received_grad.count(k)) fail(r, i, a, "output gradient not received yet");
        if (backwarded) fail(r, i, a, "repeated");
        once(a.op == Op::Backward ? st.fused : st.input_done);
        break;
      case Op::BackwardWeight:
        if (!st.input_done.count(k)) fail(r, i, a, "weight gradient before its backward_input");
        once(st.weight_done);
        break;
      case Op::SendGrad:
        if (first) fail(r, i, a, "the first stage has no previous stage");
        if (!backwarded) fail(r, i, a, "sent before its backward");
        once(st.sent_grad);
        break;
      case Op::Reduce:
        break;
    }
  }
  if (s.reduces)
    for (int c = 0; c < s.chunks; ++c)
      if (!st.reduced.count(c))
        throw ScheduleError(detail::concat("schedule: stage ", r, " never reduces chunk ", c, "'s gradients"));
  for (int c = 0; c < s.chunks; ++c)
    for (int m = 0; m < s.micro_batches; ++m) {
      const Key k{m, c};
      const int vs = s.virtual_stage(r, c);
      auto missing = [&](const std::set<Key>& done, const char* what) {
        if (!done.count(k))
          throw ScheduleError(detail::concat("schedule: stage ", r, " never runs ", what,
                                             " for micro-batch ", m, c ? detail::concat(" chunk ", c) : ""));
      };
      missing(st.forwarded, "forward");
      if (vs > 0) missing(st.received_act, "recv_activation");
      if (vs < V - 1) missing(st.sent_act, "send_activation");
      if (s.forward_only) continue;
      if (!st.fused.count(k)) missing(st.input_done, "backward");
      if (st.input_done.count(k)) missing(st.weight_done, "backward_weight");
      if (vs > 0) missing(st.sent_grad, "send_grad");
      if (vs < V - 1) missing(st.received_grad, "recv_grad");
    }
}

// A short name for an action in the deadlock grid: F3, B3, Bi3, W3, >3 (send activation), <3
// (send gradient), r>3, r<3 (their receives); ".1" for chunk 1.
std::string short_name(const Action& a) {
  const char* op = "";
  switch (a.op) {
    case Op::RecvActivation: op = "ra"; break;
    case Op::Forward: op = "F"; break;
    case Op::SendActivation: op = "sa"; break;
    case Op::RecvGrad: op = "rg"; break;
    case Op::Backward: op = "B"; break;
    case Op::BackwardInput: op = "Bi"; break;
    case Op::BackwardWeight: op = "W"; break;
    case Op::SendGrad: op = "sg"; break;
    case Op::Reduce: return detail::concat("R", a.chunk ? detail::concat(".", a.chunk) : "");
  }
  return detail::concat(op, a.micro_batch, a.chunk ? detail::concat(".", a.chunk) : "");
}

// Who waits where, then every stage's list as a row with the actions run so far, the stuck one
// marked [like this], and a few of those after it.
std::string deadlock_grid(const Schedule& s, const std::vector<size_t>& pc) {
  std::string who, grid;
  for (int r = 0; r < s.stages; ++r) {
    const auto& list = s.actions[r];
    if (pc[r] < list.size())
      who += detail::concat(who.empty() ? "" : ", ", "stage ", r, " waits at ", to_string(list[pc[r]]));
    grid += detail::concat("\n  stage ", r, ":");
    const size_t from = pc[r] > 12 ? pc[r] - 12 : 0, to = std::min(list.size(), pc[r] + 6);
    if (from > 0) grid += " ...";
    for (size_t i = from; i < to; ++i)
      grid += i == pc[r] ? " [" + short_name(list[i]) + "]" : " " + short_name(list[i]);
    if (to < list.size()) grid += " ...";
    if (pc[r] == list.size()) grid += " (done)";
  }
  return who + grid;
}

// Runs every list against unbounded mailboxes: sends never block, a receive blocks until its
// message was sent. If no stage can move while some still have actions, the lists deadlock.
void check_progress(const Schedule& s) {
  using Msg = std::tuple<int, int, int, int>;  // (destination, kind, micro-batch, chunk there)
  std::set<Msg> mailbox;
  std::vector<size_t> pc(s.stages, 0);
  size_t remaining = 0;
  for (const auto& l : s.actions) remaining += l.size();
  while (remaining > 0) {
    bool moved = false;
    for (int r = 0; r < s.stages; ++r) {
      while (pc[r] < s.actions[r].size()) {
        const Action& a = s.actions[r][pc[r]];
        const int vs = s.virtual_stage(r, a.chunk);
        if (a.op == Op::RecvActivation || a.op == Op::RecvGrad) {
          if (!mailbox.erase(Msg{r, static_cast<int>(a.op), a.micro_batch, a.chunk})) break;
        } else if (a.op == Op::SendActivation) {
          mailbox.insert({s.device_of(vs + 1), static_cast<int>(Op::RecvActivation), a.micro_batch,
                          s.chunk_of(vs + 1)});
        } else if (a.op == Op::SendGrad) {
          mailbox.insert({s.device_of(vs - 1), static_cast<int>(Op::RecvGrad), a.micro_batch,
                          s.chunk_of(vs - 1)});
        }
        ++pc[r];
        --remaining;
        moved = true;
      }
    }
    if (!moved) throw ScheduleError("schedule: deadlock: " + deadlock_grid(s, pc));
  }
  if (!mailbox.empty()) throw ScheduleError("schedule: a message is sent but never received");
}

}  // namespace

void validate(const Schedule& s) {
  if (s.stages < 1 || s.chunks < 1 || static_cast<int>(s.actions.size()) != s.stages)
    throw ScheduleError(detail::concat("schedule: expected ", s.stages, " action lists, got ",
                                       s.actions.size()));
  for (int r = 0; r < s.stages; ++r) check_local_order(s, r);
  check_progress(s);
}

}  // namespace pipetrain::schedule
