#include <gtest/gtest.h>

#include "common/error.h"
#include "schedule/schedule.h"
#include "schedule/simulate.h"

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
  s.kind = "bad";
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
  EXPECT_THROW(make_schedule("pipedream", 2, 2), ScheduleError);
  EXPECT_THROW(make_schedule("gpipe", 0, 2), ScheduleError);
  EXPECT_THROW(make_schedule("gpipe", 2, 0), ScheduleError);
  EXPECT_THROW(make_schedule("1f1b", 2, 2, 2), ScheduleError);  // chunks only for interleaved
  EXPECT_THROW(make_schedule("interleaved-1f1b", 2, 4, 1), ScheduleError);
}

TEST(MakeSchedule, InterleavedSaysWhichMicroBatchCountsWork) {
  try {
    make_schedule("interleaved-1f1b", 4, 6, 2);
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("try 4 or 8"), std::string::npos) << e.what();
  }
  try {
    make_schedule("interleaved-1f1b", 4, 3, 2);
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("try 4"), std::string::npos) << e.what();
  }
}

// Every kind, stage count 1-8, micro-batch count 1-32 and chunks 1, 2, 4 (where the kind runs
// them): the lists validate, and with equal costs the simulated bubble is the known formula.
// Costs per device: F = 1, B = 1, W = 1 (a fused backward is 2), split evenly over the chunks.
struct Shape {
  std::string kind;
  int k, m, v;
};
std::vector<Shape> all_shapes() {
  std::vector<Shape> out;
  for (const auto& kind : schedule_kinds())
    for (int k = 1; k <= 8; ++k)
      for (int m = 1; m <= 32; ++m)
        for (int v : {1, 2, 4}) {
          if (uses_chunks(kind) ? (v == 1 || m % k != 0) : v != 1) continue;
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
    const std::string what = sh.kind + " K=" + std::to_string(sh.k) + " M=" + std::to_string(sh.m) +
                             " v=" + std::to_string(sh.v);
    if (sh.kind == "gpipe" || sh.kind == "1f1b") {
      EXPECT_NEAR(sim.bubble, (K - 1) / (M + K - 1), 1e-12) << what;
      EXPECT_NEAR(sim.makespan_ms, 3 * (M + K - 1), 1e-9) << what;
    } else if (sh.kind == "interleaved-1f1b") {
      // The fill and drain shrink by v: idle time (K-1)(F+B)/v per device.
      EXPECT_NEAR(sim.makespan_ms, 3 * M + 3 * (K - 1) / v, 1e-9) << what;
      EXPECT_NEAR(sim.bubble, (K - 1) / (v * M + K - 1), 1e-12) << what;
    } else if (sh.m >= sh.k) {  // zb-h1: idle time (K-1)(F+B-W) per device
      EXPECT_NEAR(sim.makespan_ms, 3 * M + (K - 1) * (1 + 1 - 1), 1e-9) << what;
    } else {  // too few micro-batches to hide the drain: still no worse than 1f1b
      const Simulation base = simulate(make_1f1b(sh.k, sh.m), Costs::uniform(sh.k, 1, 1, 1));
      EXPECT_LE(sim.makespan_ms, base.makespan_ms + 1e-9) << what;
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
