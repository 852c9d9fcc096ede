// Schedules found by search (auto.h).
#include "schedule/auto.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "common/error.h"
#include "common/strings.h"
#include "schedule/build.h"

namespace pipetrain::schedule {

namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

struct Rules {
  bool backward_first;  // when a B and an F are both ready
  bool lookahead;       // run a W only when the next B or F is at least a W away
  double limit;         // memory per device
};

double held_cost(const Costs& c, int vs) { return c.saved_bytes.empty() ? 1.0 : c.saved_bytes[vs]; }

// One greedy run; false when the lists cannot finish under the limit.
bool greedy(const Schedule& shape, const Costs& c, const Rules& rules, std::vector<std::vector<Unit>>& order) {
  const int K = shape.stages, M = shape.micro_batches, v = shape.chunks, V = K * v;
  auto transfer = [&](int from, int to) {
    if (shape.device_of(from) == shape.device_of(to)) return 0.0;
    const double bytes = c.activation_bytes.empty() ? 0.0 : c.activation_bytes[std::min(from, to)];
    return c.latency_ms + (c.bytes_per_ms > 0 ? bytes / c.bytes_per_ms : 0.0);
  };
  auto recomputed = [&](int m) { return !c.recomputed.empty() && c.recomputed[m] && !c.recompute.empty(); };
  // input[vs][m]: when the input of micro-batch m reaches virtual stage vs; gradient[vs][m]: when
  // the gradient of vs's output does (the loss stage: when its forward ends).
  std::vector<std::vector<double>> input(V, std::vector<double>(M, kNever)), gradient = input;
  for (int m = 0; m < M; ++m) input[0][m] = 0;
  std::vector<double> clock(K, 0), memory(K, 0);
  std::vector<std::vector<int>> next_forward(K, std::vector<int>(v, 0));
  std::vector<std::vector<std::set<int>>> held(K, std::vector<std::set<int>>(v));  // forwarded, B to come
  std::vector<std::vector<std::pair<int, int>>> weights(K);  // (micro-batch, chunk), W to come, FIFO
  std::vector<size_t> weight_head(K, 0);
  order.assign(K, {});
  struct Choice {
    double start = kNever;
    Unit unit{Op::Forward, 0, 0};
  };
  std::vector<Choice> choice(K);
  std::vector<bool> dirty(K, true);
  auto evaluate = [&](int r) {
    Choice best_b, best_f;
    for (int ch = 0; ch < v; ++ch) {
      const int vs = shape.virtual_stage(r, ch);
      for (int m : held[r][ch]) {
        const double t = std::max(clock[r], gradient[vs][m]);
        if (t < best_b.start) best_b = {t, {Op::BackwardInput, m, ch}};
      }
    }
    for (int ch = v - 1; ch >= 0; --ch) {  // later virtual stages first: nearer the loss
      const int vs = shape.virtual_stage(r, ch), m = next_forward[r][ch];
      if (m >= M || memory[r] + held_cost(c, vs) > rules.limit + 1e-9) continue;
      const double t = std::max(clock[r], input[vs][m]);
      if (t < best_f.start) best_f = {t, {Op::Forward, m, ch}};
    }
    Choice pick = best_b;
    if (best_f.start < best_b.start || (best_f.start == best_b.start && !rules.backward_first)) pick = best_f;
    if (weight_head[r] < weights[r].size() && pick.start > clock[r]) {
      const auto [m, ch] = weights[r][weight_head[r]];
      const double w = c.backward_weight[shape.virtual_stage(r, ch)];
      if (!rules.lookahead || pick.start == kNever || pick.start - clock[r] >= w)
        pick = {clock[r], {Op::BackwardWeight, m, ch}};
    }
    choice[r] = pick;
    dirty[r] = false;
  };
  const size_t total = static_cast<size_t>(3) * M * V;
  for (size_t done = 0; done < total; ++done) {
    int r = -1;
    for (int d = 0; d < K; ++d) {
      if (dirty[d]) evaluate(d);
      if (choice[d].start < kNever && (r < 0 || choice[d].start < choice[r].start)) r = d;
    }
    if (r < 0) return false;  // every device waits on memory that only a blocked pass would free
    const Unit u = choice[r].unit;
    const int vs = shape.virtual_stage(r, u.chunk), m = u.micro_batch;
    double end = choice[r].start;
    if (u.op == Op::Forward) {
      end += c.forward[vs];
      memory[r] += held_cost(c, vs);
      ++next_forward[r][u.chunk];
      held[r][u.chunk].insert(m);
      if (vs == V - 1) {
        gradient[vs][m] = end;
      } else {
        input[vs + 1][m] = end + transfer(vs, vs + 1);
        dirty[shape.device_of(vs + 1)] = true;
      }
    } else if (u.op == Op::BackwardInput) {
      end += c.backward_input[vs] + (recomputed(m) ? c.recompute[vs] : 0.0);
      held[r][u.chunk].erase(m);
      weights[r].emplace_back(m, u.chunk);
      if (vs > 0) {
        gradient[vs - 1][m] = end + transfer(vs, vs - 1);
        dirty[shape.device_of(vs - 1)] = true;
      }
    } else {
      end += c.backward_weight[vs];
      memory[r] -= held_cost(c, vs);
      ++weight_head[r];
    }
    clock[r] = end;
    order[r].push_back(u);
    dirty[r] = true;
  }
  return true;
}

}  // namespace

Schedule search_schedule(Kind kind, int stages, int micro_batches, int chunks, Placement placement,
                         const Costs& costs, double memory_limit) {
  Schedule shape{kind, stages, micro_batches, chunks, {}, placement};
  shape.actions.resize(stages);
  // The least memory any schedule needs: one micro-batch through the device's chunks.
  double least = 0;
  for (int r = 0; r < stages; ++r) {
    double need = 0;
    for (int ch = 0; ch < chunks; ++ch) need += held_cost(costs, shape.virtual_stage(r, ch));
    least = std::max(least, need);
  }
  if (!(memory_limit >= least))
    throw ScheduleError(detail::concat("schedule: ", name(kind), ": a memory limit of ", memory_limit,
                                       " per device fits no schedule; the least that could work is ", least));
  // The shortest step; between equal steps, the shortest longest device span (the zero-bubble
  // paper's measure, which leaves out the wait of the last devices for the first input).
  Schedule best;
  double best_ms = kNever, best_span = kNever;
  auto consider = [&](Schedule s) {
    const Simulation sim = simulate(s, costs);
    const double span = *std::max_element(sim.span_ms.begin(), sim.span_ms.end());
    const double tolerance = 1e-9 * std::max(1.0, sim.makespan_ms);
    if (sim.makespan_ms < best_ms - tolerance || (sim.makespan_ms <= best_ms + tolerance && span < best_span - tolerance))
      best_ms = sim.makespan_ms, best_span = span, best = std::move(s);
  };
  for (double share : {1.0, 0.75, 0.5})
    for (bool backward_first : {true, false})
      for (bool lookahead : {false, true}) {
        const double limit = std::max(least, memory_limit * share);
        std::vector<std::vector<Unit>> order;
        if (greedy(shape, costs, {backward_first, lookahead, limit}, order))
          consider(expand(kind, stages, micro_batches, chunks, placement, order));
      }
  if (chunks == 1 && placement == Placement::Loop) {
    for (Schedule s : {make_zb_h1(stages, micro_batches), make_zb_h2(stages, micro_batches)}) {
      const Simulation sim = simulate(s, costs);
      if (*std::max_element(sim.peak_memory.begin(), sim.peak_memory.end()) <= memory_limit + 1e-9) {
        s.kind = kind;
        consider(std::move(s));
      }
    }
  }
  if (best_ms == kNever)
    throw ScheduleError(detail::concat("schedule: ", name(kind), ": no schedule completes under a memory limit of ",
                                       memory_limit, " per device"));
  return best;
}

double twice_1f1b_memory(int stages, int micro_batches, const Costs& costs) {
  // In the search's own units: it counts a micro-batch's saved bytes whether or not it is
  // recomputed, so 1F1B is measured the same way.
  Costs whole = costs;
  whole.recomputed.clear();
  const Simulation sim = simulate(make_1f1b(stages, micro_batches), whole);
  return 2 * *std::max_element(sim.peak_memory.begin(), sim.peak_memory.end());
}

Schedule make_zb_auto(int stages, int micro_batches, const Costs& costs, double memory_limit) {
  check_supported(Kind::ZbAuto, stages, micro_batches, 1);
  return search_schedule(Kind::ZbAuto, stages, micro_batches, 1, Placement::Loop, costs, memory_limit);
}

Schedule make_zb_v(int stages, int micro_batches) {
  check_supported(Kind::ZbV, stages, micro_batches, 2);
  return search_schedule(Kind::ZbV, stages, micro_batches, 2, Placement::V, Costs::uniform(2 * stages, 1, 1, 1),
                         2.0 * stages);
}

Schedule exhaustive_best(int stages, int micro_batches, const Costs& costs, size_t max_candidates) {
  const int M = micro_batches;
  // Every order of one device's passes with F before B before W for each micro-batch.
  std::vector<std::vector<Unit>> orders;
  std::vector<int> progress(M, 0);
  std::vector<Unit> current;
  const Op ops[3] = {Op::Forward, Op::BackwardInput, Op::BackwardWeight};
  auto walk = [&](auto&& self) -> void {
    if (current.size() == static_cast<size_t>(3 * M)) return orders.push_back(current);
    for (int m = 0; m < M; ++m) {
      if (progress[m] == 3) continue;
      current.push_back({ops[progress[m]++], m, 0});
      self(self);
      --progress[m];
      current.pop_back();
    }
  };
  walk(walk);
  double combos = std::pow(static_cast<double>(orders.size()), stages);
  if (combos > static_cast<double>(max_candidates))
    throw ScheduleError(detail::concat("schedule: exhaustive search over ", combos, " combinations (more than ",
                                       max_candidates, ")"));
  Schedule best;
  double best_ms = kNever;
  std::vector<size_t> pick(stages, 0);
  std::vector<std::vector<Unit>> order(stages);
  for (;;) {
    for (int r = 0; r < stages; ++r) order[r] = orders[pick[r]];
    Schedule s = expand(Kind::ZbAuto, stages, M, 1, Placement::Loop, order);
    try {
      const double ms = simulate(s, costs).makespan_ms;
      if (ms < best_ms - 1e-9) best_ms = ms, best = std::move(s);
    } catch (const ScheduleError&) {  // this combination deadlocks
    }
    int r = 0;
    while (r < stages && ++pick[r] == orders.size()) pick[r++] = 0;
    if (r == stages) break;
  }
  return best;
}

}  // namespace pipetrain::schedule
