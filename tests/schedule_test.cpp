#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "schedule/auto.h"
#include "schedule/in_order.h"
#include "schedule/schedule.h"
#include "schedule/simulate.h"
#include "schedule/trace.h"

using namespace pipetrain;
using namespace pipetrain::schedule;

TEST(GPipe, ValidForManyShapes) {
  for (int k = 1; k <= 8; ++k)
    for (int m = 1; m <= 32; ++m) {
      Schedule s = make_gpipe(k, m);
      EXPECT_NO_THROW(validate(s)) << k << " stages, " << m << " micro-batches";
      for (int r = 0; r < k; ++r) {
        const size_t comm = (r > 0 ? 2 : 0) + (r < k - 1 ? 2 : 0);
        EXPECT_EQ(s.actions[r].size(), static_cast<size_t>(m) * (2 + comm));
      }
    }
}

TEST(GPipe, FillDrainOrder) {
  Schedule s = make_gpipe(2, 3);
  EXPECT_EQ(s.actions[0][0], (Action{Op::Forward, 0}));
  EXPECT_EQ(s.actions[0][6], (Action{Op::RecvGrad, 2}));  // backward starts with the last micro-batch
  EXPECT_EQ(s.actions[1][0], (Action{Op::RecvActivation, 0}));
  EXPECT_EQ(s.actions[1].back(), (Action{Op::SendGrad, 0}));
}

TEST(Validate, RejectsMissingBackward) {
  Schedule s = make_gpipe(2, 2);
  auto& l = s.actions[0];
  l.erase(std::find(l.begin(), l.end(), Action{Op::Backward, 1}));
  EXPECT_THROW(validate(s), ScheduleError);
}

TEST(Validate, RejectsBackwardBeforeForward) {
  Schedule s = make_gpipe(1, 2);
  std::swap(s.actions[0][0], s.actions[0][3]);
  EXPECT_THROW(validate(s), ScheduleError);
}

TEST(Validate, RejectsForwardBeforeItsInputArrives) {
  Schedule s = make_gpipe(2, 1);
  std::swap(s.actions[1][0], s.actions[1][1]);  // forward before recv_activation
  EXPECT_THROW(validate(s), ScheduleError);
}

TEST(Validate, DetectsDeadlock) {
  // Stage 0 waits for a gradient before sending the activation stage 1 needs to produce it.
  Schedule s;
  s.stages = 2;
  s.micro_batches = 1;
  s.actions = {{{Op::Forward, 0}, {Op::RecvGrad, 0}, {Op::SendActivation, 0}, {Op::Backward, 0}},
               {{Op::RecvActivation, 0}, {Op::Forward, 0}, {Op::Backward, 0}, {Op::SendGrad, 0}}};
  try {
    validate(s);
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("deadlock"), std::string::npos) << e.what();
  }
}

TEST(Validate, RejectsCommunicationPastTheEnds) {
  Schedule s = make_gpipe(2, 1);
  s.actions[0].insert(s.actions[0].begin(), Action{Op::RecvActivation, 0});
  EXPECT_THROW(validate(s), ScheduleError);
}

TEST(MakeSchedule, UnknownKindAndSizes) {
  EXPECT_THROW(make_schedule(parse_kind("pipedream"), 2, 2), ScheduleError);
  EXPECT_THROW(make_schedule(parse_kind("gpipe"), 0, 2), ScheduleError);
  EXPECT_THROW(make_schedule(parse_kind("gpipe"), 2, 0), ScheduleError);
  EXPECT_THROW(make_schedule(parse_kind("1f1b"), 2, 2, 2), ScheduleError);  // chunks only for interleaved
  EXPECT_THROW(make_schedule(parse_kind("interleaved-1f1b"), 2, 4, 1), ScheduleError);
}

// The one table of kinds: every row is where Kind says, its name parses back to it, the
// schedule it builds carries its kind and placement, runs its default chunks, and splits the
// backward exactly when the row says so.
TEST(KindTable, EveryRowAnswersForItsKind) {
  ASSERT_EQ(kind_table().size(), all_kinds().size());
  for (Kind k : all_kinds()) {
    const KindInfo& row = info(k);
    EXPECT_EQ(row.kind, k);
    EXPECT_EQ(parse_kind(row.name), k);
    EXPECT_LE(row.min_chunks, row.default_chunks);
    EXPECT_LE(row.default_chunks, row.max_chunks);
    const int stages = 2, micro_batches = std::max(4, stages * row.min_micro_batches_per_stage);
    const Schedule s = make_schedule(k, stages, micro_batches, row.default_chunks);
    EXPECT_EQ(s.kind, k) << row.name;
    EXPECT_EQ(s.placement, row.placement) << row.name;
    EXPECT_EQ(s.chunks, row.default_chunks) << row.name;
    bool split = false;
    for (const auto& list : s.actions)
      for (const Action& a : list) split = split || a.op == Op::BackwardInput;
    EXPECT_EQ(split, row.splits_backward) << row.name;
    EXPECT_EQ(chunks_for(k, 0), row.default_chunks) << row.name;
    EXPECT_EQ(chunks_for(k, 64), row.max_chunks == 64 ? 64 : row.default_chunks) << row.name;
  }
  try {
    parse_kind("pipedream");
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown kind 'pipedream' (known: gpipe, 1f1b, interleaved-1f1b"),
              std::string::npos) << e.what();
  }
  EXPECT_FALSE(find_kind("1F1B").has_value());  // names are exact
}

TEST(MakeSchedule, InterleavedSaysWhichMicroBatchCountsWork) {
  try {
    make_schedule(parse_kind("interleaved-1f1b"), 4, 6, 2);
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("try 4 or 8"), std::string::npos) << e.what();
  }
  try {
    make_schedule(parse_kind("interleaved-1f1b"), 4, 3, 2);
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("try 4"), std::string::npos) << e.what();
  }
}

// Every kind, stage count 1-8, micro-batch count 1-32 and chunks 1, 2, 4 (where the kind runs
// them): the lists validate, and with equal costs the simulated bubble is the known formula.
// Costs per device: F = 1, B = 1, W = 1 (a fused backward is 2), split evenly over the chunks.
struct Shape {
  Kind kind;
  int k, m, v;
};
std::vector<Shape> all_shapes() {
  std::vector<Shape> out;
  for (Kind kind : all_kinds())
    for (int k = 1; k <= 8; ++k)
      for (int m = 1; m <= 32; ++m)
        for (int v : {1, 2, 4}) {
          try {
            check_supported(kind, k, m, v);
          } catch (const ScheduleError&) {
            continue;
          }
          out.push_back({kind, k, m, v});
        }
  return out;
}

TEST(Schedules, ValidForEveryShape) {
  int checked = 0;
  for (const Shape& sh : all_shapes()) {
    Schedule s = make_schedule(sh.kind, sh.k, sh.m, sh.v);
    ASSERT_NO_THROW(validate(s)) << sh.kind << " K=" << sh.k << " M=" << sh.m << " v=" << sh.v;
    ++checked;
  }
  EXPECT_GT(checked, 8 * 32 * 3);
}

TEST(Simulator, BubbleMatchesTheFormulas) {
  for (const Shape& sh : all_shapes()) {
    const double K = sh.k, M = sh.m, v = sh.v;
    const Simulation sim = simulate(make_schedule(sh.kind, sh.k, sh.m, sh.v),
                                    Costs::uniform(sh.k * sh.v, 1 / v, 1 / v, 1 / v));
    const std::string what = std::string(name(sh.kind)) + " K=" + std::to_string(sh.k) + " M=" + std::to_string(sh.m) +
                             " v=" + std::to_string(sh.v);
    if (sh.kind == Kind::GPipe || sh.kind == Kind::OneFOneB) {
      EXPECT_NEAR(sim.bubble, (K - 1) / (M + K - 1), 1e-12) << what;
      EXPECT_NEAR(sim.makespan_ms, 3 * (M + K - 1), 1e-9) << what;
    } else if (sh.kind == Kind::Interleaved1F1B) {
      // The fill and drain shrink by v: idle time (K-1)(F+B)/v per device.
      EXPECT_NEAR(sim.makespan_ms, 3 * M + 3 * (K - 1) / v, 1e-9) << what;
      EXPECT_NEAR(sim.bubble, (K - 1) / (v * M + K - 1), 1e-12) << what;
    } else if (sh.kind == Kind::ZbH1 && sh.m >= sh.k) {  // idle time (K-1)(F+B-W) per device
      EXPECT_NEAR(sim.makespan_ms, 3 * M + (K - 1) * (1 + 1 - 1), 1e-9) << what;
    } else if (sh.kind == Kind::ZbH2 && sh.m >= 2 * sh.k - 1) {  // every span (K-1)(F+B-2W) = 0 over the work
      for (double span : sim.span_ms) EXPECT_NEAR(span, 3 * M, 1e-9) << what;
    } else if (sh.kind == Kind::LoopedBfs) {  // breadth first: no better than fill-drain over K·v virtual stages
      EXPECT_GE(sim.makespan_ms, 3 * M + 3 * (K - 1) / v - 1e-9) << what;
    } else {  // too few micro-batches to hide the drain: still no worse than 1f1b
      const Simulation base = simulate(make_1f1b(sh.k, sh.m), Costs::uniform(sh.k, 1, 1, 1));
      EXPECT_LE(sim.makespan_ms, base.makespan_ms + 1e-9) << what;
    }
  }
}

TEST(Simulator, NewSchedulesBeat1F1BWithEqualCosts) {
  for (const Shape& sh : all_shapes()) {
    if (sh.kind != Kind::ZbH2 && sh.kind != Kind::ZbV && sh.kind != Kind::DualPipeV && sh.kind != Kind::ZbAuto) continue;
    if (sh.m < sh.k) continue;
    const double v = sh.v;
    const Simulation sim = simulate(make_schedule(sh.kind, sh.k, sh.m, sh.v),
                                    Costs::uniform(sh.k * sh.v, 1 / v, 1 / v, 1 / v));
    const Simulation base = simulate(make_1f1b(sh.k, sh.m), Costs::uniform(sh.k, 1, 1, 1));
    const std::string what = std::string(name(sh.kind)) + " K=" + std::to_string(sh.k) + " M=" + std::to_string(sh.m);
    EXPECT_LE(sim.makespan_ms, base.makespan_ms + 1e-9) << what;
    if (sh.k > 1) {
      EXPECT_LT(sim.bubble, base.bubble) << what;
    }
  }
}

TEST(Simulator, InFlightMicroBatches) {
  for (int k = 1; k <= 8; ++k)
    for (int m = 1; m <= 32; ++m) {
      const auto gpipe = simulate(make_gpipe(k, m), Costs::uniform(k, 1, 1, 1));
      const auto one = simulate(make_1f1b(k, m), Costs::uniform(k, 1, 1, 1));
      const auto zb = simulate(make_zb_h1(k, m), Costs::uniform(k, 1, 1, 1));
      for (int r = 0; r < k; ++r) {
        EXPECT_EQ(gpipe.peak_in_flight[r], m);
        EXPECT_EQ(one.peak_in_flight[r], std::min(m, k - r)) << "1f1b K=" << k << " M=" << m << " r=" << r;
        EXPECT_EQ(zb.peak_in_flight[r], std::min(m, k - r)) << "zb-h1 K=" << k << " M=" << m << " r=" << r;
        // Stage r holds back up to r weight gradients on top of its in-flight activations.
        EXPECT_LE(zb.peak_awaiting_weight[r], std::min(m, k - r) + r);
        EXPECT_EQ(one.peak_awaiting_weight[r], one.peak_in_flight[r]);
      }
    }
}

TEST(Simulator, TransfersAndRecomputationCost) {
  Costs c = Costs::uniform(2, 1, 1, 1);
  const double free_ms = simulate(make_gpipe(2, 1), c).makespan_ms;  // F F B B on the chain: 1+1+2+2
  EXPECT_NEAR(free_ms, 6, 1e-12);
  c.latency_ms = 0.5;
  c.activation_bytes = {1000, 0};
  c.bytes_per_ms = 1000;  // 1 ms per transfer of stage 0's output (and its gradient)
  EXPECT_NEAR(simulate(make_gpipe(2, 1), c).makespan_ms, 6 + 2 * 1.5, 1e-12);
  // Per-device bandwidths: a transfer runs at its slower end's (device 1 at 250 bytes/ms: 4 ms).
  c.device_bytes_per_ms = {1000, 250};
  EXPECT_NEAR(simulate(make_gpipe(2, 1), c).makespan_ms, 6 + 2 * 4.5, 1e-12);
  c.device_bytes_per_ms = {1000};
  EXPECT_THROW(simulate(make_gpipe(2, 1), c), ScheduleError);
  Costs r = Costs::uniform(2, 1, 1, 1);
  r.recompute = {1, 1};
  r.recomputed = {true};
  EXPECT_NEAR(simulate(make_gpipe(2, 1), r).makespan_ms, 8, 1e-12);
}

TEST(Simulator, RejectsACostTableOfTheWrongSize) {
  EXPECT_THROW(simulate(make_gpipe(2, 2), Costs::uniform(3, 1, 1, 1)), ScheduleError);
  Costs c = Costs::uniform(2, 1, 1, 1);
  c.recomputed = {true};
  EXPECT_THROW(simulate(make_gpipe(2, 2), c), ScheduleError);
}

TEST(Validate, RejectsWeightGradientBeforeItsInputGradient) {
  Schedule s = make_zb_h1(1, 1);
  ASSERT_EQ(s.actions[0].size(), 3u);
  std::swap(s.actions[0][1], s.actions[0][2]);
  EXPECT_THROW(validate(s), ScheduleError);
  Schedule t = make_zb_h1(1, 1);
  t.actions[0].pop_back();  // W missing
  EXPECT_THROW(validate(t), ScheduleError);
}

TEST(Interleaved, ChunksAlternateDevices) {
  Schedule s = make_interleaved_1f1b(2, 2, 2);
  EXPECT_EQ(s.virtual_stages(), 4);
  EXPECT_EQ(s.device_of(2), 0);
  EXPECT_EQ(s.chunk_of(2), 1);
  // Stage 1's chunk 0 sends to stage 0's chunk 1.
  bool sends_on = false;
  for (const auto& a : s.actions[1])
    if (a.op == Op::SendActivation && a.chunk == 0) sends_on = true;
  EXPECT_TRUE(sends_on);
}

TEST(VPlacement, ChunksTurnOnTheLastDevice) {
  Schedule s = make_zb_v(3, 6);
  ASSERT_EQ(s.placement, Placement::V);
  // Device r holds virtual stages r and 2K-1-r; the loss (virtual stage 5) is on device 0.
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(s.virtual_stage(r, 0), r);
    EXPECT_EQ(s.virtual_stage(r, 1), 5 - r);
  }
  for (int vs = 0; vs < 6; ++vs) EXPECT_EQ(s.virtual_stage(s.device_of(vs), s.chunk_of(vs)), vs);
  EXPECT_EQ(s.device_of(5), 0);
  EXPECT_EQ(s.device_of(2), s.device_of(3));  // the turn: handed over on one device
  EXPECT_THROW(make_schedule(parse_kind("zb-v"), 2, 4, 3), ScheduleError);
  EXPECT_THROW(make_schedule(parse_kind("dualpipev"), 4, 7, 2), ScheduleError);  // needs M >= 2K
}

TEST(Simulator, ActivationMemoryOverTime) {
  Costs c = Costs::uniform(2, 1, 1, 1);
  c.saved_bytes = {100, 10};
  const Simulation g = simulate(make_gpipe(2, 4), c);
  EXPECT_DOUBLE_EQ(g.peak_memory[0], 400);  // fill-drain holds every micro-batch
  EXPECT_DOUBLE_EQ(g.peak_memory[1], 40);
  const Simulation o = simulate(make_1f1b(2, 4), c);
  EXPECT_DOUBLE_EQ(o.peak_memory[0], 200);  // 1F1B: K - r micro-batches
  EXPECT_DOUBLE_EQ(o.peak_memory[1], 10);
  // The counter returns to zero and never goes below.
  for (const auto& series : o.memory) {
    EXPECT_DOUBLE_EQ(series.back().second, 0);
    for (const auto& [ms, held] : series) EXPECT_GE(held, 0) << ms;
  }
  // Recomputed micro-batches hold only their input between forward and backward.
  c.recompute = {1, 1};
  c.recomputed = {true, true, true, true};
  c.activation_bytes = {7, 0};
  const Simulation r = simulate(make_gpipe(2, 4), c);
  EXPECT_DOUBLE_EQ(r.peak_memory[0], 0);
  EXPECT_DOUBLE_EQ(r.peak_memory[1], 28);
  // ZB-H2 holds about twice 1F1B's activations; ZB-H1 the same as 1F1B.
  const Simulation one = simulate(make_1f1b(4, 16), Costs::uniform(4, 1, 1, 1));
  const Simulation h1 = simulate(make_zb_h1(4, 16), Costs::uniform(4, 1, 1, 1));
  const Simulation h2 = simulate(make_zb_h2(4, 16), Costs::uniform(4, 1, 1, 1));
  EXPECT_DOUBLE_EQ(one.peak_memory[0], 4);
  EXPECT_DOUBLE_EQ(h1.peak_memory[0], 4);
  EXPECT_DOUBLE_EQ(h2.peak_memory[0], 7);
  for (int r = 0; r < 4; ++r) EXPECT_LE(h2.peak_memory[r], 2 * 4);
}

// The zero-bubble paper (Qi et al., ICLR 2024): its Table 9 gives the profiled F, B, W and
// communication costs (ms) of four GPT models, and its Table 5 the bubble rate of 1F1B, ZB-H1 and
// ZB-H2 computed from them: (cost - m(F+B+W)) / cost, cost = the longest stage span.
struct PaperRow {
  const char* model;
  int p, m;
  double F, B, W, comm, one_f_one_b, zb_h1, zb_h2;
};
const PaperRow kPaper[] = {
    {"1.5B", 8, 24, 18.522, 18.086, 9.337, 0.601, 0.2431, 0.1585, 0.1083},
    {"1.5B", 8, 32, 18.513, 18.086, 9.331, 0.626, 0.1985, 0.1242, 0.0837},
    {"1.5B", 8, 64, 18.546, 18.097, 9.321, 0.762, 0.1240, 0.0674, 0.0444},
    {"6.2B", 8, 24, 29.718, 29.444, 19.927, 0.527, 0.2347, 0.1323, 0.0698},
    {"6.2B", 8, 32, 29.802, 29.428, 19.530, 0.577, 0.1898, 0.1045, 0.0559},
    {"6.2B", 8, 64, 29.935, 29.621, 19.388, 0.535, 0.1091, 0.0554, 0.0294},
    {"14.6B", 16, 48, 11.347, 11.248, 8.132, 0.377, 0.2552, 0.1397, 0.0672},
    {"14.6B", 16, 64, 11.307, 11.254, 8.101, 0.379, 0.2082, 0.1088, 0.0516},
    {"14.6B", 16, 128, 11.325, 11.308, 8.109, 0.378, 0.1251, 0.0576, 0.0266},
    {"28.3B", 32, 96, 10.419, 10.207, 7.715, 0.408, 0.2646, 0.1421, 0.0641},
    {"28.3B", 32, 128, 10.408, 10.204, 7.703, 0.408, 0.2168, 0.1106, 0.0490},
    {"28.3B", 32, 256, 10.402, 10.248, 7.698, 0.460, 0.1352, 0.0594, 0.0257},
};

double paper_bubble(const Schedule& s, const Costs& c, const PaperRow& row) {
  const Simulation sim = simulate(s, c);
  const double cost = *std::max_element(sim.span_ms.begin(), sim.span_ms.end());
  return (cost - row.m * (row.F + row.B + row.W)) / cost;
}

TEST(ZeroBubblePaper, Table5FromTable9) {
  int checked = 0;
  for (const PaperRow& row : kPaper) {
    Costs c = Costs::uniform(row.p, row.F, row.B, row.W);
    c.latency_ms = row.comm;
    const std::string what = std::string(row.model) + " p=" + std::to_string(row.p) + " m=" + std::to_string(row.m);
    EXPECT_NEAR(paper_bubble(make_1f1b(row.p, row.m), c, row), row.one_f_one_b, 1e-3) << what;
    EXPECT_NEAR(paper_bubble(make_zb_h1(row.p, row.m), c, row), row.zb_h1, 1e-3) << what;
    EXPECT_NEAR(paper_bubble(make_zb_h2(row.p, row.m), c, row), row.zb_h2, 1e-3) << what;
    checked += 3;
  }
  EXPECT_EQ(checked, 36);
}

// zb-auto on the same rows with twice 1F1B's memory (the paper's ZB-2p setting): never a longer
// step than ZB-H2, and on the paper's measure no worse than ZB-H2. The figures are printed for
// the schedules page of the manual.
TEST(ZeroBubblePaper, AutoScheduleWithTwice1F1BMemory) {
  for (const PaperRow& row : kPaper) {
    Costs c = Costs::uniform(row.p, row.F, row.B, row.W);
    c.latency_ms = row.comm;
    const Schedule h2 = make_zb_h2(row.p, row.m);
    const Schedule best = make_zb_auto(row.p, row.m, c, 2.0 * row.p);
    ASSERT_NO_THROW(validate(best));
    const Simulation a = simulate(best, c), b = simulate(h2, c);
    const std::string what = std::string(row.model) + " p=" + std::to_string(row.p) + " m=" + std::to_string(row.m);
    EXPECT_LE(a.makespan_ms, b.makespan_ms + 1e-9) << what;
    // The synchronous step cannot be shorter than the last device's wait for its first input
    // plus its own work; zb-auto comes within 0.1% of that bound on every row.
    const double bound = (row.p - 1) * (row.F + row.comm) + row.m * (row.F + row.B + row.W);
    EXPECT_GE(a.makespan_ms, bound - 1e-9) << what;
    EXPECT_LE(a.makespan_ms, bound * 1.001) << what;
    const double mine = paper_bubble(best, c, row);
    EXPECT_LE(mine, row.zb_h2 + 1e-3) << what;
    for (double peak : a.peak_memory) EXPECT_LE(peak, 2.0 * row.p) << what;
    std::printf("  %-6s p=%-2d m=%-3d zb-auto bubble %.4f (paper's measure), %.4f of the step\n", row.model,
                row.p, row.m, mine, a.bubble);
  }
}

// zb-auto against the exact optimum, every order of every device's passes simulated, on sizes
// small enough to enumerate, with uneven costs and transfers.
TEST(ZbAuto, MatchesTheExhaustiveOptimumOnSmallSizes) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> cost(0.5, 2.0);
  for (const auto& [k, m] : std::vector<std::pair<int, int>>{{2, 2}, {3, 2}})
    for (int trial = 0; trial < 4; ++trial) {
      Costs c = Costs::uniform(k, 1, 1, 1);
      for (int v = 0; v < k; ++v) c.forward[v] = cost(rng), c.backward_input[v] = cost(rng), c.backward_weight[v] = cost(rng);
      c.latency_ms = trial % 2 ? 0.3 : 0;
      const double exact = simulate(exhaustive_best(k, m, c), c).makespan_ms;
      const double found = simulate(make_zb_auto(k, m, c, m), c).makespan_ms;
      EXPECT_NEAR(found, exact, 1e-9) << "K=" << k << " M=" << m << " trial " << trial;
    }
}

TEST(ZbAuto, RespectsTheMemoryLimitAndNamesTheLeastThatFits) {
  Costs c = Costs::uniform(4, 1, 1, 1);
  c.saved_bytes = {100, 100, 100, 100};
  for (double limit : {100.0, 250.0, 400.0, 800.0}) {
    const Schedule s = make_zb_auto(4, 12, c, limit);
    for (double peak : simulate(s, c).peak_memory) EXPECT_LE(peak, limit);
  }
  // More memory never makes the step longer.
  EXPECT_LE(simulate(make_zb_auto(4, 12, c, 800), c).makespan_ms, simulate(make_zb_auto(4, 12, c, 400), c).makespan_ms);
  try {
    make_zb_auto(4, 12, c, 99);
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("the least that could work is 100"), std::string::npos) << e.what();
  }
}

// Malformed lists: each is rejected with the stage and the action named.
TEST(Validate, TableOfBrokenLists) {
  struct Broken {
    const char* what;
    std::function<void(Schedule&)> breaks;
    const char* expected;
  };
  const std::vector<Broken> cases = {
      {"forward repeated", [](Schedule& s) { s.actions[0].insert(s.actions[0].begin() + 1, {Op::Forward, 0}); },
       "stage 0 action 1 forward(mb 0): repeated"},
      {"micro-batch out of range", [](Schedule& s) { s.actions[0][0].micro_batch = 9; },
       "stage 0 action 0 forward(mb 9): micro-batch out of range"},
      {"chunk out of range", [](Schedule& s) { s.actions[1][0].chunk = 1; },
       "stage 1 action 0 recv_activation(mb 0, chunk 1): chunk out of range"},
      {"send before forward", [](Schedule& s) { std::swap(s.actions[0][0], s.actions[0][1]); },
       "stage 0 action 0 send_activation(mb 0): sent before its forward"},
      {"gradient sent before backward",
       [](Schedule& s) {
         auto& l = s.actions[1];
         auto sg = std::find(l.begin(), l.end(), Action{Op::SendGrad, 0});
         l.erase(sg);
         l.insert(l.begin() + 2, Action{Op::SendGrad, 0});
       },
       "stage 1 action 2 send_grad(mb 0): sent before its backward"},
      {"backward before gradient received",
       [](Schedule& s) {
         auto& l = s.actions[0];
         auto rg = std::find(l.begin(), l.end(), Action{Op::RecvGrad, 1});
         std::iter_swap(rg, rg + 1);
       },
       "backward(mb 1): output gradient not received yet"},
      {"receive past the first stage", [](Schedule& s) { s.actions[0].insert(s.actions[0].begin(), {Op::RecvActivation, 0}); },
       "stage 0 action 0 recv_activation(mb 0): the first stage has no previous stage"},
      {"send past the last stage", [](Schedule& s) { s.actions[1].push_back({Op::SendActivation, 1}); },
       "the last stage has no next stage"},
      {"W before B", [](Schedule& s) { s = make_zb_h1(1, 1), std::swap(s.actions[0][1], s.actions[0][2]); },
       "backward_weight(mb 0): weight gradient before its backward_input"},
      {"missing W", [](Schedule& s) { s = make_zb_h1(1, 2), s.actions[0].pop_back(); },
       "stage 0 never runs backward_weight for micro-batch 1"},
      {"missing forward", [](Schedule& s) { s = make_gpipe(1, 2), s.actions[0].erase(s.actions[0].begin() + 1); },
       "backward(mb 1): backward before its forward"},
      {"missing receive", [](Schedule& s) { s.actions[1].erase(s.actions[1].begin()); },
       "stage 1 action 0 forward(mb 0): input not received yet"},
  };
  for (const Broken& b : cases) {
    Schedule s = make_gpipe(2, 2);
    b.breaks(s);
    try {
      validate(s);
      ADD_FAILURE() << b.what << ": accepted";
    } catch (const ScheduleError& e) {
      EXPECT_NE(std::string(e.what()).find(b.expected), std::string::npos) << b.what << ": " << e.what();
    }
  }
}

// A deadlock is shown as the grid of every stage's actions with the stuck ones marked.
TEST(Validate, DeadlockIsShownAsAGrid) {
  // Stage 1 takes micro-batch 1 before 0; stage 0 waits for 0's gradient before it sends 1.
  Schedule s = make_1f1b(2, 3);
  s.actions[0] = {{Op::Forward, 0}, {Op::SendActivation, 0}, {Op::RecvGrad, 0}, {Op::Backward, 0},
                  {Op::Forward, 1}, {Op::SendActivation, 1}, {Op::RecvGrad, 1}, {Op::Backward, 1},
                  {Op::Forward, 2}, {Op::SendActivation, 2}, {Op::RecvGrad, 2}, {Op::Backward, 2}};
  s.actions[1].clear();
  for (int m : {1, 0, 2})
    for (Op op : {Op::RecvActivation, Op::Forward, Op::Backward, Op::SendGrad}) s.actions[1].push_back({op, m});
  try {
    validate(s);
    FAIL();
  } catch (const ScheduleError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("deadlock: stage 0 waits at recv_grad(mb 0), stage 1 waits at recv_activation(mb 1)"),
              std::string::npos) << m;
    EXPECT_NE(m.find("\n  stage 0: F0 sa0 [rg0] B0 F1"), std::string::npos) << m;
    EXPECT_NE(m.find("\n  stage 1: [ra1]"), std::string::npos) << m;
  }
}

// A trace always parses: titles with quotes, backslashes and control characters keep them
// (escaped, not replaced), and a time that is not finite is written as null, not bare.
TEST(Trace, AnyNameAndTimeMakeValidJson) {
  const std::string title = "run \"a\"\\b\n\tc\x01";
  TraceTimeline t{title, {{TraceSpan{"forward", 0, 0, 1, 0.0, 1.5},
                           TraceSpan{"backward", 0, 0, 1, 2.0, std::numeric_limits<double>::quiet_NaN()}}},
                  "held", {{{0.5, 3.0}}}};
  std::ostringstream out;
  write_chrome_trace(out, {t});
  const auto j = nlohmann::json::parse(out.str());
  int spans = 0, nulls = 0;
  bool titled = false;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") titled = e["args"]["name"] == title;
    if (e["ph"] == "X") ++spans, nulls += e["dur"].is_null();
  }
  EXPECT_TRUE(titled) << out.str();
  EXPECT_GE(spans, 2);
  EXPECT_EQ(nulls, 1) << out.str();
}

// An evaluation's lists (Pipeline::predict runs them): forwards only, for every kind's placement
// and chunks, valid and deadlock-free; a backward in such a schedule is refused.
TEST(ForwardOnly, ValidForEveryKindAndRefusesBackwards) {
  for (const Shape& sh : all_shapes()) {
    if (sh.k > 4 || sh.m > 8) continue;
    const Schedule train = make_schedule(sh.kind, sh.k, sh.m, sh.v);
    for (int m : {1, sh.m}) {
      const Schedule eval = forward_only(train, m);
      EXPECT_TRUE(eval.forward_only);
      EXPECT_EQ(eval.placement, train.placement);
      ASSERT_NO_THROW(validate(eval)) << name(sh.kind) << " K=" << sh.k << " M=" << m << " v=" << sh.v;
      for (const auto& list : eval.actions)
        for (const Action& a : list)
          EXPECT_TRUE(a.op == Op::Forward || a.op == Op::RecvActivation || a.op == Op::SendActivation);
    }
  }
  Schedule bad = forward_only(make_gpipe(1, 1), 1);
  bad.actions[0].push_back({Op::Backward, 0, 0});
  EXPECT_THROW(validate(bad), ScheduleError);
  EXPECT_THROW(with_reductions(forward_only(make_gpipe(2, 2), 2)), ScheduleError);
}

// In-order delivery (schedule/in_order.h): every kind with its devices in a loop sends each
// neighbour its messages in the order the neighbour receives them. In the V placements a device
// exchanges activations and gradients of two chunks with the same neighbour: zb-v keeps the
// order only with at most as many micro-batches as stages, dualpipev only on two stages. A
// hand-made crossing is named by pair, position and message.
TEST(InOrder, LoopPlacementsHoldAndVPlacementsDoNot) {
  int checked = 0;
  for (Kind k : all_kinds())
    for (int stages = 1; stages <= 4; ++stages)
      for (int m = 1; m <= 9; ++m) {
        const int chunks = chunks_for(k);
        Schedule s;
        try {
          check_supported(k, stages, m, chunks);
          s = make_schedule(k, stages, m, chunks);
        } catch (const ScheduleError&) {
          continue;
        }
        ++checked;
        const bool holds = placement_of(k) != Placement::V || stages == 1 ||
                           (k == Kind::ZbV && m <= stages) || (k == Kind::DualPipeV && stages == 2);
        if (!holds) {
          EXPECT_THROW(validate_in_order(s), ScheduleError) << name(k) << " K=" << stages << " M=" << m;
        } else {
          EXPECT_NO_THROW(validate_in_order(s)) << name(k) << " K=" << stages << " M=" << m;
        }
      }
  EXPECT_GT(checked, 100);
  Schedule s = make_1f1b(2, 2);
  auto& sends = s.actions[0];  // stage 0 sends the activations of micro-batches 0 and 1 swapped
  std::vector<size_t> at;
  for (size_t i = 0; i < sends.size(); ++i)
    if (sends[i].op == Op::SendActivation) at.push_back(i);
  ASSERT_EQ(at.size(), 2u);
  std::swap(sends[at[0]].micro_batch, sends[at[1]].micro_batch);
  try {
    validate_in_order(s);
    ADD_FAILURE() << "a crossing was accepted";
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("stage 1's receive #1 from stage 0 is the activation of micro-batch 0, but stage "
                                         "0's send #1 to it is the activation of micro-batch 1"),
              std::string::npos)
        << e.what();
  }
}
