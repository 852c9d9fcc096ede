#include "schedule/schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <tuple>

#include "common/error.h"
#include "common/strings.h"
#include "schedule/auto.h"
#include "schedule/build.h"

namespace pipetrain::schedule {

// Turns each device's compute order into its action list: a receive right before the compute
// that needs it, a send right after the compute that produces it.
Schedule expand(Kind kind, int stages, int micro_batches, int chunks, Placement placement,
                const std::vector<std::vector<Unit>>& order) {
  Schedule s{kind, stages, micro_batches, chunks, {}, placement};
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
    case Op::Reduce: return "reduce";
  }
  return "?";
}

std::string to_string(const Action& a) {
  if (a.op == Op::Reduce) return detail::concat(op_name(a.op), "(chunk ", a.chunk, ")");
  return detail::concat(op_name(a.op), "(mb ", a.micro_batch,
                        a.chunk ? detail::concat(", chunk ", a.chunk) : "", ")");
}

bool is_compute(Op op) {
  return op == Op::Forward || op == Op::Backward || op == Op::BackwardInput ||
         op == Op::BackwardWeight;
}

Schedule pipeline_schedule(Kind kind, int stages, int micro_batches, int chunks, int data_parallel) {
  Schedule s = make_schedule(kind, stages, micro_batches, chunks);
  return data_parallel > 1 ? with_reductions(std::move(s)) : s;
}

Schedule forward_only(const Schedule& shape, int micro_batches) {
  if (micro_batches < 1)
    throw ScheduleError(detail::concat("schedule: micro_batches must be >= 1, got ", micro_batches));
  std::vector<std::vector<Unit>> order(shape.stages);
  for (auto& o : order)
    for (int m = 0; m < micro_batches; ++m)
      for (int c = 0; c < shape.chunks; ++c) o.push_back({Op::Forward, m, c});
  Schedule s = expand(shape.kind, shape.stages, micro_batches, shape.chunks, shape.placement, order);
  s.forward_only = true;
  return s;
}

Schedule with_reductions(Schedule s) {
  if (s.reduces) return s;
  if (s.forward_only) throw ScheduleError("schedule: a forward-only schedule has no gradients to reduce");
  for (auto& list : s.actions)
    for (int c = s.chunks - 1; c >= 0; --c) {
      size_t last = list.size();
      for (size_t i = 0; i < list.size(); ++i)
        if (list[i].chunk == c && (list[i].op == Op::Backward || list[i].op == Op::BackwardWeight)) last = i;
      if (last == list.size()) throw ScheduleError(detail::concat("schedule: chunk ", c, " has no backward to reduce after"));
      list.insert(list.begin() + static_cast<std::ptrdiff_t>(last) + 1, Action{Op::Reduce, -1, c});
    }
  s.reduces = true;
  return s;
}

Schedule make_gpipe(int stages, int micro_batches) {
  check_supported(Kind::GPipe, stages, micro_batches, 1);
  std::vector<std::vector<Unit>> order(stages);
  for (auto& o : order) {
    for (int m = 0; m < micro_batches; ++m) o.push_back({Op::Forward, m, 0});
    for (int m = micro_batches - 1; m >= 0; --m) o.push_back({Op::Backward, m, 0});
  }
  return expand(Kind::GPipe, stages, micro_batches, 1, Placement::Loop, order);
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
  check_supported(Kind::OneFOneB, stages, micro_batches, 1);
  return expand(Kind::OneFOneB, stages, micro_batches, 1, Placement::Loop, one_f_one_b(stages, micro_batches, false));
}

Schedule make_zb_h1(int stages, int micro_batches) {
  check_supported(Kind::ZbH1, stages, micro_batches, 1);
  return expand(Kind::ZbH1, stages, micro_batches, 1, Placement::Loop, one_f_one_b(stages, micro_batches, true));
}

Schedule make_zb_h2(int stages, int micro_batches) {
  check_supported(Kind::ZbH2, stages, micro_batches, 1);
  const int K = stages, M = micro_batches;
  std::vector<std::vector<Unit>> order(K);
  for (int r = 0; r < K; ++r) {
    auto& o = order[r];
    // Warm-up forwards fill the wait for the first gradient; the held-back Ws (2r on stage r)
    // fill the drain, so every stage's span is the same parallelogram.
    const int warmup = std::min(M, 2 * (K - r) - 1), keep = 2 * r;
    int f = 0, b = 0, w = 0;
    while (f < warmup) o.push_back({Op::Forward, f++, 0});
    while (b < M) {
      o.push_back({Op::BackwardInput, b++, 0});
      if (b - w > keep) o.push_back({Op::BackwardWeight, w++, 0});
      if (f < M) o.push_back({Op::Forward, f++, 0});
    }
    while (w < M) o.push_back({Op::BackwardWeight, w++, 0});
  }
  return expand(Kind::ZbH2, K, M, 1, Placement::Loop, order);
}

Schedule make_looped_bfs(int stages, int micro_batches, int chunks) {
  check_supported(Kind::LoopedBfs, stages, micro_batches, chunks);
  std::vector<std::vector<Unit>> order(stages);
  for (auto& o : order) {
    for (int c = 0; c < chunks; ++c)
      for (int m = 0; m < micro_batches; ++m) o.push_back({Op::Forward, m, c});
    for (int c = chunks - 1; c >= 0; --c)
      for (int m = 0; m < micro_batches; ++m) o.push_back({Op::Backward, m, c});
  }
  return expand(Kind::LoopedBfs, stages, micro_batches, chunks, Placement::Loop, order);
}

Schedule make_interleaved_1f1b(int stages, int micro_batches, int chunks) {
  check_supported(Kind::Interleaved1F1B, stages, micro_batches, chunks);
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
  return expand(Kind::Interleaved1F1B, K, M, v, Placement::Loop, order);
}

Schedule make_schedule(Kind kind, int stages, int micro_batches, int chunks) {
  check_supported(kind, stages, micro_batches, chunks);
  return info(kind).build(stages, micro_batches, chunks);
}

}  // namespace pipetrain::schedule
