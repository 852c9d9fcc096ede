#include "schedule/schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <tuple>

#include "common/error.h"
#include "common/strings.h"

namespace pipetrain::schedule {

const char* op_name(Op op) {
  switch (op) {
    case Op::RecvActivation: return "recv_activation";
    case Op::Forward: return "forward";
    case Op::SendActivation: return "send_activation";
    case Op::RecvGrad: return "recv_grad";
    case Op::Backward: return "backward";
    case Op::BackwardInput: return "backward_input";
    case Op::BackwardWeight: return "backward_weight";
    case Op::SendGrad: return "send_grad";
  }
  return "?";
}

std::string to_string(const Action& a) {
  return detail::concat(op_name(a.op), "(mb ", a.micro_batch,
                        a.chunk ? detail::concat(", chunk ", a.chunk) : "", ")");
}

bool is_compute(Op op) {
  return op == Op::Forward || op == Op::Backward || op == Op::BackwardInput ||
         op == Op::BackwardWeight;
}

std::vector<std::string> schedule_kinds() { return {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1"}; }

bool uses_chunks(const std::string& kind) { return kind == "interleaved-1f1b"; }

namespace {

void check_sizes(int stages, int micro_batches, int chunks) {
  if (stages < 1) throw ScheduleError(detail::concat("schedule: stages must be >= 1, got ", stages));
  if (micro_batches < 1)
    throw ScheduleError(detail::concat("schedule: micro_batches must be >= 1, got ", micro_batches));
  if (chunks < 1) throw ScheduleError(detail::concat("schedule: chunks must be >= 1, got ", chunks));
}

// A compute step of one device, before the communication around it is added.
struct Unit {
  Op op;
  int micro_batch, chunk;
};

// Turns each device's compute order into its action list: a receive right before the compute
// that needs it, a send right after the compute that produces it.
Schedule expand(std::string kind, int stages, int micro_batches, int chunks,
                const std::vector<std::vector<Unit>>& order) {
  Schedule s{std::move(kind), stages, micro_batches, chunks, {}};
  s.actions.resize(stages);
  const int V = s.virtual_stages();
  for (int r = 0; r < stages; ++r) {
    auto& list = s.actions[r];
    for (const Unit& u : order[r]) {
      const int vs = s.virtual_stage(r, u.chunk);
      const bool first = vs == 0, last = vs == V - 1;
      if (u.op == Op::Forward) {
        if (!first) list.push_back({Op::RecvActivation, u.micro_batch, u.chunk});
        list.push_back({Op::Forward, u.micro_batch, u.chunk});
        if (!last) list.push_back({Op::SendActivation, u.micro_batch, u.chunk});
      } else if (u.op == Op::Backward || u.op == Op::BackwardInput) {
        if (!last) list.push_back({Op::RecvGrad, u.micro_batch, u.chunk});
        list.push_back({u.op, u.micro_batch, u.chunk});
        if (!first) list.push_back({Op::SendGrad, u.micro_batch, u.chunk});
      } else {
        list.push_back({u.op, u.micro_batch, u.chunk});
      }
    }
  }
  return s;
}

// "8" or "4 or 8": the multiples of k nearest to m.
std::string nearest_multiples(int k, int m) {
  const int below = (m / k) * k, above = below + k;
  return below >= k ? detail::concat(below, " or ", above) : std::to_string(above);
}

}  // namespace

void check_supported(const std::string& kind, int stages, int micro_batches, int chunks) {
  const auto kinds = schedule_kinds();
  if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end())
    throw ScheduleError("schedule: unknown kind '" + kind + "' (known: " + join(kinds, ", ") + ")");
  check_sizes(stages, micro_batches, chunks);
  if (!uses_chunks(kind) && chunks != 1)
    throw ScheduleError(detail::concat("schedule: ", kind, " runs one chunk per stage, got chunks = ",
                                       chunks, " (use interleaved-1f1b for virtual stages)"));
  if (kind == "interleaved-1f1b") {
    if (chunks < 2)
      throw ScheduleError(detail::concat(
          "schedule: interleaved-1f1b needs chunks >= 2, got ", chunks, " (use 1f1b for one chunk)"));
    if (micro_batches % stages != 0)
      throw ScheduleError(detail::concat(
          "schedule: interleaved-1f1b sends micro-batches in groups of the stage count (", stages,
          "), so micro_batches must be a multiple of ", stages, "; got ", micro_batches, ", try ",
          nearest_multiples(stages, micro_batches)));
  }
}

Schedule make_gpipe(int stages, int micro_batches) {
  check_supported("gpipe", stages, micro_batches, 1);
  std::vector<std::vector<Unit>> order(stages);
  for (auto& o : order) {
    for (int m = 0; m < micro_batches; ++m) o.push_back({Op::Forward, m, 0});
    for (int m = micro_batches - 1; m >= 0; --m) o.push_back({Op::Backward, m, 0});
  }
  return expand("gpipe", stages, micro_batches, 1, order);
}

namespace {
// One-forward-one-backward with `warmup(r)` forwards first. With `split`, each backward is B
// and stage r holds back r W passes, running each after a later B and the rest at the end, so
// that gradients travel up the pipeline without waiting for weight gradients.
std::vector<std::vector<Unit>> one_f_one_b(int K, int M, bool split) {
  std::vector<std::vector<Unit>> order(K);
  for (int r = 0; r < K; ++r) {
    auto& o = order[r];
    const int warmup = std::min(K - r - 1, M);
    const int defer = r;  // later stages hold back more W passes: their Bs unblock earlier stages
    int next_w = 0;
    auto backward = [&](int m) {
      o.push_back({split ? Op::BackwardInput : Op::Backward, m, 0});
      if (split && m >= defer) o.push_back({Op::BackwardWeight, next_w++, 0});
    };
    for (int m = 0; m < warmup; ++m) o.push_back({Op::Forward, m, 0});
    for (int i = 0; i < M - warmup; ++i) {
      o.push_back({Op::Forward, warmup + i, 0});
      backward(i);
    }
    for (int m = M - warmup; m < M; ++m) backward(m);
    while (split && next_w < M) o.push_back({Op::BackwardWeight, next_w++, 0});
  }
  return order;
}
}  // namespace

Schedule make_1f1b(int stages, int micro_batches) {
  check_supported("1f1b", stages, micro_batches, 1);
  return expand("1f1b", stages, micro_batches, 1, one_f_one_b(stages, micro_batches, false));
}

Schedule make_zb_h1(int stages, int micro_batches) {
  check_supported("zb-h1", stages, micro_batches, 1);
  return expand("zb-h1", stages, micro_batches, 1, one_f_one_b(stages, micro_batches, true));
}

Schedule make_interleaved_1f1b(int stages, int micro_batches, int chunks) {
  check_supported("interleaved-1f1b", stages, micro_batches, chunks);
  const int K = stages, M = micro_batches, v = chunks, total = M * v;
  // Unit k of a device: micro-batches go in groups of K through chunk 0, then the same group
  // through chunk 1, and so on; backwards visit the chunks in reverse.
  auto micro_batch = [&](int k) { return (k / (K * v)) * K + k % K; };
  auto fwd_chunk = [&](int k) { return (k / K) % v; };
  std::vector<std::vector<Unit>> order(K);
  for (int r = 0; r < K; ++r) {
    auto& o = order[r];
    const int warmup = M == K ? total : std::min(total, (K - r - 1) * 2 + (v - 1) * K);
    for (int k = 0; k < warmup; ++k) o.push_back({Op::Forward, micro_batch(k), fwd_chunk(k)});
    for (int i = 0; i < total - warmup; ++i) {
      o.push_back({Op::Forward, micro_batch(warmup + i), fwd_chunk(warmup + i)});
      o.push_back({Op::Backward, micro_batch(i), v - 1 - fwd_chunk(i)});
    }
    for (int k = total - warmup; k < total; ++k)
      o.push_back({Op::Backward, micro_batch(k), v - 1 - fwd_chunk(k)});
  }
  return expand("interleaved-1f1b", K, M, v, order);
}

Schedule make_schedule(const std::string& kind, int stages, int micro_batches, int chunks) {
  check_supported(kind, stages, micro_batches, chunks);
  if (kind == "gpipe") return make_gpipe(stages, micro_batches);
  if (kind == "1f1b") return make_1f1b(stages, micro_batches);
  if (kind == "zb-h1") return make_zb_h1(stages, micro_batches);
  return make_interleaved_1f1b(stages, micro_batches, chunks);
}

namespace {

// Per-stage bookkeeping while checking one list in isolation, keyed by (micro-batch, chunk).
using Key = std::pair<int, int>;
struct StageState {
  std::set<Key> received_act, forwarded, sent_act, received_grad, fused, input_done, weight_done,
      sent_grad;
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
    if (a.micro_batch < 0 || a.micro_batch >= s.micro_batches) fail(r, i, a, "micro-batch out of range");
    if (a.chunk < 0 || a.chunk >= s.chunks) fail(r, i, a, "chunk out of range");
    const Key k{a.micro_batch, a.chunk};
    const int vs = s.virtual_stage(r, a.chunk);
    const bool first = vs == 0, last = vs == V - 1;
    auto once = [&](std::set<Key>& done) {
      if (!done.insert(k).second) fail(r, i, a, "repeated");
    };
    const bool backwarded = st.fused.count(k) || st.input_done.count(k);
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
    }
  }
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
      if (!st.fused.count(k)) missing(st.input_done, "backward");
      if (st.input_done.count(k)) missing(st.weight_done, "backward_weight");
      if (vs > 0) missing(st.received_act, "recv_activation"), missing(st.sent_grad, "send_grad");
      if (vs < V - 1) missing(st.sent_act, "send_activation"), missing(st.received_grad, "recv_grad");
    }
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
  if (s.stages < 1 || s.chunks < 1 || static_cast<int>(s.actions.size()) != s.stages)
    throw ScheduleError(detail::concat("schedule: expected ", s.stages, " action lists, got ",
                                       s.actions.size()));
  for (int r = 0; r < s.stages; ++r) check_local_order(s, r);
  check_progress(s);
}

}  // namespace pipetrain::schedule
