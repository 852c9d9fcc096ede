// The auto-planner's search on fixed cost tables, where the best plan is known by hand.
#include <gtest/gtest.h>

#include <map>

#include <torch/torch.h>

#include "common/error.h"
#include "pipeline/pipeline.h"
#include "planner/autoplan.h"
#include "planner/plan.h"
#include "job/balance.h"
#include "schedule/schedule.h"

using namespace pipetrain;
using namespace pipetrain::job;
using namespace pipetrain::planner;

namespace {

// Four equal layers whose costs are proportional to the micro-batch's rows (batch 8): per row,
// forward 0.1 ms, backward 0.2 ms (B and W 0.1 each), 100 parameter bytes per layer and 10
// saved bytes per row and layer; no optimizer time.
struct Table {
  std::map<int64_t, profiler::Profile> by_rows;
  const profiler::Profile& operator()(int64_t r, Precision) {
    auto& p = by_rows[r];
    if (p.layers.empty()) {
      const double rows = static_cast<double>(r);
      for (int i = 0; i < 4; ++i) {
        partitioner::LayerCost l;
        l.name = "layer" + std::to_string(i);
        l.forward_ms = 0.1 * rows, l.backward_ms = 0.2 * rows;
        l.param_bytes = 100, l.activation_bytes = static_cast<int64_t>(rows),
        l.saved_bytes = static_cast<int64_t>(10 * rows);
        p.layers.push_back(l);
        p.backward_input_ms.push_back(0.1 * rows), p.backward_weight_ms.push_back(0.1 * rows);
      }
    }
    return p;
  }
};

SearchSpace space() {
  SearchSpace s;
  s.devices = 2, s.batch = 8, s.layers = 4;
  s.micro_batches = {1, 2, 4, 8};
  s.schedules = {schedule::Kind::GPipe, schedule::Kind::OneFOneB};
  s.recompute = {Recompute::Never};
  s.precisions = {Precision::FP32};
  s.balances = {job::BalanceMethod::Uniform};
  return s;
}

}  // namespace

// Free transfers and costs proportional to rows: two stages and the most micro-batches win,
// with the fill-drain step (M + K - 1) x (2 layers x 0.3 ms x 1 row) = 9 x 0.6 = 5.4 ms.
TEST(AutoPlan, MostMicroBatchesOnEveryDeviceWin) {
  Table t;
  const SearchResult r = search_plans(
      space(), [&](int64_t rows, Precision p, int) -> const profiler::Profile& { return t(rows, p); });
  ASSERT_FALSE(r.fitting.empty());
  const Candidate& best = r.fitting.front();
  EXPECT_EQ(best.stages, 2);
  EXPECT_EQ(best.micro_batches, 8);
  EXPECT_NEAR(best.step_ms, 9 * 0.6, 1e-9);
  EXPECT_NEAR(best.samples_per_s, 8 / 5.4e-3, 1e-6);
  // One stage: 4 layers x 0.3 ms x 8 rows = 9.6 ms at any micro-batch count.
  for (const Candidate& c : r.fitting)
    if (c.stages == 1) {
      EXPECT_NEAR(c.step_ms, 9.6, 1e-9);
    }
  // 1 + 2 x 4 (one stage: gpipe only; two: gpipe and 1f1b at each M) = 12 candidates.
  EXPECT_EQ(r.considered, 12u);
}

// Under a limit that gpipe's 8 held micro-batches break but 1f1b's 2 do not, 1f1b wins:
// 2 layers x 100 bytes x (1 + 3) = 800 bytes of parameters and state, plus 20 bytes per held
// micro-batch (gpipe 160: 960 in all; 1f1b 40: 840).
TEST(AutoPlan, MemoryLimitLeavesOnly1F1B) {
  Table t;
  SearchSpace s = space();
  s.memory_limit = {900};
  const SearchResult r =
      search_plans(s, [&](int64_t rows, Precision p, int) -> const profiler::Profile& { return t(rows, p); });
  const Candidate& best = r.fitting.front();
  EXPECT_EQ(best.schedule, schedule::Kind::OneFOneB);
  EXPECT_EQ(best.micro_batches, 8);
  EXPECT_NEAR(best.max_peak_bytes(), 840, 1e-9);
  for (const Candidate& c : r.fitting) EXPECT_LE(c.max_peak_bytes(), 900);
}

// Workspace and headroom: a layer's workspace (its largest transient) comes on top of what the
// device holds, once per device; the headroom keeps that share of the limit free. With 30 bytes
// of workspace per layer 1f1b's peak at M=8, the least of any plan, is 840 + 30 = 870: it fits
// a limit of 870 exactly, not with 5% headroom, where the error names the limit that would
// (870 / 0.95, rounded up: 916), and that limit fits it again.
TEST(AutoPlan, WorkspaceAndHeadroomCountAgainstTheLimit) {
  Table t;
  auto with_workspace = [&](int64_t rows, Precision p, int) -> const profiler::Profile& {
    profiler::Profile& prof = const_cast<profiler::Profile&>(t(rows, p));
    for (auto& l : prof.layers) l.workspace_bytes = 30;
    return prof;
  };
  SearchSpace s = space();
  s.memory_limit = {870};
  SearchResult r = search_plans(s, with_workspace);
  ASSERT_EQ(r.fitting.size(), 1u);
  EXPECT_EQ(r.fitting.front().schedule, schedule::Kind::OneFOneB);
  EXPECT_EQ(r.fitting.front().micro_batches, 8);
  EXPECT_NEAR(r.fitting.front().max_peak_bytes(), 870, 1e-9);
  s.memory_headroom = 0.05;
  try {
    search_plans(s, with_workspace);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "the smallest needs 870 bytes on its fullest device, a limit of 916 with 5% headroom"),
              std::string::npos)
        << e.what();
  }
  s.memory_limit = {916};
  r = search_plans(s, with_workspace);
  ASSERT_EQ(r.fitting.size(), 1u);
  EXPECT_NEAR(r.fitting.front().max_peak_bytes(), 870, 1e-9);
}

TEST(AutoPlan, InfeasibleLimitNamesTheSmallestThatFits) {
  Table t;
  SearchSpace s = space();
  s.memory_limit = {100};
  try {
    search_plans(s, [&](int64_t rows, Precision p, int) -> const profiler::Profile& { return t(rows, p); });
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("the smallest needs 840 bytes"), std::string::npos) << e.what();
  }
}

// A slower second device: the time balance puts fewer layers on it.
TEST(AutoPlan, DeviceSpeedsMoveLayers) {
  Table t;
  SearchSpace s = space();
  s.balances = {job::BalanceMethod::Uniform, job::BalanceMethod::Time};
  s.speeds = {1.0, 1.0 / 3};
  const SearchResult r =
      search_plans(s, [&](int64_t rows, Precision p, int) -> const profiler::Profile& { return t(rows, p); });
  const Candidate& best = r.fitting.front();
  ASSERT_EQ(best.stages, 2);
  EXPECT_EQ(best.balance_method, job::BalanceMethod::Time);
  EXPECT_EQ(best.balance, (partitioner::Balance{3, 1}));
}

// Data parallelism: two copies of one stage each run half the batch with no bubble,
// 4 layers x 0.3 ms x 4 rows = 4.8 ms, against the two-stage pipeline's 5.4 ms; a reduction that
// costs more than the difference hands the win back to the pipeline (one stage: its reduction
// follows its last backward, exposed whole).
TEST(AutoPlan, DataParallelWinsUntilItsReductionCostsMoreThanTheBubble) {
  Table t;
  SearchSpace s = space();
  s.max_data_parallel = 2;
  auto profile = [&](int64_t rows, Precision p, int) -> const profiler::Profile& { return t(rows, p); };
  SearchResult r = search_plans(s, profile);
  EXPECT_EQ(r.fitting.front().data_parallel, 2);
  EXPECT_EQ(r.fitting.front().stages, 1);
  EXPECT_NEAR(r.fitting.front().step_ms, 4.8, 1e-9);
  // 400 gradient bytes at 400 bytes/ms + 1 ms: a 2 ms all-reduce, 6.8 ms in all (sharded: a 1 ms
  // reduce-scatter, and a 1 ms all-gather after the optimizer).
  s.link = [](int) {
    profiler::ReduceLink link;
    link.all_reduce = {1.0, 400.0};
    link.reduce_scatter = link.all_gather = {0.5, 800.0};
    return link;
  };
  r = search_plans(s, profile);
  EXPECT_EQ(r.fitting.front().data_parallel, 1);
  EXPECT_EQ(r.fitting.front().stages, 2);
  bool seen = false;
  for (const Candidate& c : r.fitting)
    if (c.data_parallel == 2 && c.micro_batches == 1) {
      EXPECT_NEAR(c.step_ms, 6.8, 1e-9) << c.schedule << (c.sharded ? " sharded" : "");
      EXPECT_NEAR(c.exposed_reduce_ms, c.sharded ? 1.0 : 2.0, 1e-9);
      seen = true;
    }
  EXPECT_TRUE(seen);
}

// Sharding the optimizer state is what lets two copies of the whole model fit: Adam keeps 3
// bytes per parameter byte, two copies add the reduction's buffer (4), sharded across two the
// state and the slice make it 1 + 1 + (2 + 1) / 2 = 3.5; 400 parameter bytes and 160 bytes
// of activations: 2160 against 1960.
TEST(AutoPlan, ShardedOptimizerStateFitsWhereTheWholeStateDoesNot) {
  Table t;
  SearchSpace s = space();
  s.max_data_parallel = 2;
  s.schedules = {schedule::Kind::GPipe};
  s.memory_limit = {2000};
  OptimizerConfig adam;
  adam.kind = OptimizerKind::Adam;
  s.state_factor = [&](Precision p, int D, bool sharded) { return state_factor(adam, p, D, sharded); };
  const SearchResult r =
      search_plans(s, [&](int64_t rows, Precision p, int) -> const profiler::Profile& { return t(rows, p); });
  bool sharded = false;
  for (const Candidate& c : r.fitting) {
    EXPECT_FALSE(c.data_parallel == 2 && !c.sharded) << "2160 bytes do not fit 2000";
    if (c.data_parallel == 2 && c.sharded) {
      EXPECT_NEAR(c.max_peak_bytes(), 1960, 1e-9);
      sharded = true;
    }
  }
  EXPECT_TRUE(sharded);
}

// Transfers between stages cost time on the slower end's link: one device with a slow link
// (0.1 byte/ms: 10 ms for a micro-batch's one-byte activation) makes one stage the better plan.
TEST(AutoPlan, ASlowDeviceLinkKeepsTheModelOnOneDevice) {
  Table t;
  SearchSpace s = space();
  auto profile = [&](int64_t rows, Precision p, int) -> const profiler::Profile& { return t(rows, p); };
  s.bytes_per_ms = 1000;
  s.device_bytes_per_ms = {1000, 1000};
  EXPECT_EQ(search_plans(s, profile).fitting.front().stages, 2);
  s.device_bytes_per_ms = {1000, 0.1};
  const SearchResult r = search_plans(s, profile);
  EXPECT_EQ(r.fitting.front().stages, 1);
  EXPECT_NEAR(r.fitting.front().step_ms, 9.6, 1e-9);
}

// plan and plan --auto predict the action lists a pipeline runs for every kind: zb-auto among
// them, which a pipeline builds with no profile (a search on equal costs), so a plan searched on
// profiled costs would predict a schedule that never runs.
TEST(AutoPlan, PredictsTheSchedulesAPipelineRuns) {
  struct Case {
    std::string kind;
    int stages, micro_batches, chunks;
  };
  for (const Case& c : {Case{"gpipe", 3, 6, 1}, Case{"1f1b", 3, 6, 1}, Case{"zb-h1", 3, 6, 1}, Case{"zb-h2", 3, 6, 1},
                        Case{"zb-auto", 3, 6, 1}, Case{"zb-auto", 2, 8, 1}, Case{"interleaved-1f1b", 2, 4, 2},
                        Case{"looped-bfs", 2, 4, 2}, Case{"zb-v", 2, 5, 2}, Case{"dualpipev", 2, 4, 2}}) {
    SCOPED_TRACE(c.kind + " K=" + std::to_string(c.stages) + " M=" + std::to_string(c.micro_batches));
    torch::nn::Sequential model;
    for (int i = 0; i < 8; ++i) model->push_back(torch::nn::Linear(4, 4));
    pipeline::PipelineOptions o;
    o.stages = c.stages, o.micro_batches = c.micro_batches, o.schedule = schedule::parse_kind(c.kind), o.chunks = c.chunks;
    pipeline::Pipeline pipe(model, o, [](const at::Tensor& out, const at::Tensor& t) {
      return torch::nn::functional::cross_entropy(out, t);
    });
    EXPECT_EQ(schedule::pipeline_schedule(schedule::parse_kind(c.kind), c.stages, c.micro_batches, c.chunks, 1).actions,
              pipe.schedule().actions);
  }
}

// The cores as a dimension. The table's layers at T threads take 1/(T x efficiency) of their
// one-thread time; two workers computing at once are each slowed by `contention`. The plain
// loop on both cores (K=1, T=2, M=1: 4 layers x 0.3 ms x 8 rows / (2 x eff)) is a candidate
// like any other and is picked where it is fastest: against 2 stages of 1 thread at M=8
// (5.4 ms x contention).
TEST(AutoPlan, ThePlainLoopOnEveryCoreIsACandidateAndWinsWhenFastest) {
  struct Case {
    double efficiency, contention;
    bool plain_wins;
  };
  for (const Case& k : {Case{0.9, 1.3, true}, Case{0.55, 1.0, false}}) {
    const double efficiency = k.efficiency, contention = k.contention;
    const bool plain_wins = k.plain_wins;
    Table t;
    std::map<std::pair<int64_t, int>, profiler::Profile> threaded;
    auto profile = [&](int64_t rows, Precision p, int threads) -> const profiler::Profile& {
      if (threads == 1) return t(rows, p);
      auto& q = threaded[{rows, threads}];
      if (q.layers.empty()) {
        q = t(rows, p);
        const double f = 1.0 / (threads * efficiency);
        for (auto& l : q.layers) l.forward_ms *= f, l.backward_ms *= f;
        for (auto& b : q.backward_input_ms) b *= f;
        for (auto& w : q.backward_weight_ms) w *= f;
      }
      return q;
    };
    SearchSpace s = space();
    s.cores = 2;
    s.contention = [c = contention](int busy) { return busy >= 2 ? c : 1.0; };
    const SearchResult r = search_plans(s, profile);
    const double plain_ms = 4 * 0.3 * 8 / (2 * efficiency), pipeline_ms = 5.4 * contention;
    const Candidate* plain = plain_loop(r, 2, Precision::FP32);
    ASSERT_NE(plain, nullptr);
    EXPECT_EQ(plain->threads, 2);
    EXPECT_NEAR(plain->step_ms, plain_ms, 1e-9);
    const Candidate& best = r.fitting.front();
    if (plain_wins) {
      EXPECT_EQ(&best, plain);
    } else {
      EXPECT_EQ(best.stages, 2);
      EXPECT_EQ(best.threads, 1);
      EXPECT_NEAR(best.step_ms, pipeline_ms, 1e-9);
    }
    // Every plan keeps to the cores: K x D x T <= 2.
    for (const Candidate& c : r.fitting) EXPECT_LE(c.stages * c.data_parallel * c.threads, 2);
  }
}

// Between 1 and n threads a layer follows Amdahl's law fitted to the two profiles: 10 ms on one
// thread and 4 ms on 4 give a serial share of (0.4 - 0.25) / 0.75 = 0.2, so 6 ms on 2.
TEST(AutoPlan, ThreadsBetweenOneAndAllFollowAmdahlsLaw) {
  profiler::Profile p1, p4;
  partitioner::LayerCost l;
  l.forward_ms = 10, l.backward_ms = 20;
  p1.layers = {l};
  l.forward_ms = 4, l.backward_ms = 5;  // the backward scales perfectly: 20 / 4
  p4.layers = {l};
  const profiler::Profile p2 = at_threads(p1, p4, 4, 2);
  EXPECT_NEAR(p2.layers[0].forward_ms, 6, 1e-12);
  EXPECT_NEAR(p2.layers[0].backward_ms, 10, 1e-12);
  EXPECT_NEAR(at_threads(p1, p4, 4, 4).layers[0].forward_ms, 4, 1e-12);
  EXPECT_NEAR(at_threads(p1, p4, 4, 1).layers[0].forward_ms, 10, 1e-12);
}

// The straggler wait: with data parallelism each reduction waits for the slowest copy. One
// stage, 2 copies of 4 rows each, M=1, a free link: each copy computes 4 x 0.3 x 4 = 4.8 ms, and
// a straggler share of 0.25 adds 1.2 ms to the step (the reduction is the step's last action).
TEST(AutoPlan, TheStragglerWaitIsChargedAtTheReduction) {
  Table t;
  auto profile = [&](int64_t rows, Precision p, int) -> const profiler::Profile& { return t(rows, p); };
  auto step_of = [&](double share) {
    SearchSpace s = space();
    s.max_data_parallel = 2;
    s.straggler = [share](int) { return share; };
    for (const Candidate& c : search_plans(s, profile).fitting)
      if (c.stages == 1 && c.data_parallel == 2 && c.micro_batches == 1 && !c.sharded) return c.step_ms;
    ADD_FAILURE() << "no 1 x 2 plan";
    return 0.0;
  };
  EXPECT_NEAR(step_of(0.0), 4.8, 1e-9);
  EXPECT_NEAR(step_of(0.25) - step_of(0.0), 1.2, 1e-9);
}

namespace {

// The table with deferred weight gradients measured: a deferring layer's backward 0.15 ms per
// row (0.05 of its W stashed: 4 bytes per row), its flush `flush_per_row` ms per row of the
// batch; layers listed in `keep` do not defer.
struct DeferringTable : Table {
  double flush_per_row;
  std::vector<int> keep;
  explicit DeferringTable(double f, std::vector<int> k = {}) : flush_per_row(f), keep(std::move(k)) {}
  const profiler::Profile& operator()(int64_t r, Precision prec) {
    profiler::Profile& p = const_cast<profiler::Profile&>(Table::operator()(r, prec));
    if (p.deferred_bytes.empty())
      for (int i = 0; i < 4; ++i) {
        const bool defers = std::find(keep.begin(), keep.end(), i) == keep.end();
        const double rows = static_cast<double>(r);
        p.deferred_backward_ms.push_back(defers ? 0.15 * rows : 0.2 * rows);
        p.flush_ms.push_back(defers ? flush_per_row * rows : 0.0);
        p.deferred_bytes.push_back(defers ? 4 * r : 0);
      }
    return p;
  }
};

}  // namespace

// schedule_costs with a whole batch's profile: each deferring layer's backward the deferred one
// (W less what the stash takes; the first stage's W its whole deferred backward), a layer that
// does not defer as it was, and each device's tail the flush of its layers (of every chunk) at
// the batch's rows.
TEST(AutoPlan, DeferredCostsReplaceTheBackwardAndAddTheFlush) {
  DeferringTable t(0.05, {1});  // layer 1 does not defer
  const profiler::Profile& p = t(1, Precision::FP32);
  const profiler::Profile& whole = t(8, Precision::FP32);
  const auto gpipe = schedule::pipeline_schedule(schedule::Kind::GPipe, 2, 8, 1, 1);
  const schedule::Costs c = schedule_costs(p, {2, 2}, gpipe, Recompute::Never, &whole);
  EXPECT_NEAR(c.backward_input[0], 0.15 + 0.2, 1e-12);  // layer 0 deferred, layer 1 not
  EXPECT_NEAR(c.backward_input[1], 0.15 + 0.15, 1e-12);
  ASSERT_EQ(c.tail_ms.size(), 2u);
  EXPECT_NEAR(c.tail_ms[0], 0.05 * 8, 1e-12);  // layer 0's flush alone
  EXPECT_NEAR(c.tail_ms[1], 2 * 0.05 * 8, 1e-12);
  EXPECT_TRUE(c.finish_ms.empty());  // no optimizer times: the flush is not finishing work
  const schedule::Costs plain = schedule_costs(p, {2, 2}, gpipe, Recompute::Never);
  EXPECT_NEAR(plain.backward_input[0], 0.4, 1e-12);
  EXPECT_TRUE(plain.tail_ms.empty());
  const auto zb = schedule::pipeline_schedule(schedule::Kind::ZbH1, 2, 8, 1, 1);
  const schedule::Costs split = schedule_costs(p, {2, 2}, zb, Recompute::Never, &whole);
  EXPECT_NEAR(split.backward_input[0], 0.0, 1e-12);
  EXPECT_NEAR(split.backward_weight[0], 0.15 + 0.2, 1e-12);  // the first stage: its backwards whole
  EXPECT_NEAR(split.backward_input[1], 0.2, 1e-12);          // B as profiled
  EXPECT_NEAR(split.backward_weight[1], 2 * 0.05, 1e-12);    // W 0.1 less the 0.05 the stash takes
  // Two chunks per device: device 0 runs layers 0 and 2, device 1 layers 1 and 3.
  const auto looped = schedule::pipeline_schedule(schedule::Kind::Interleaved1F1B, 2, 8, 2, 1);
  const schedule::Costs chunks = schedule_costs(p, {1, 1, 1, 1}, looped, Recompute::Never, &whole);
  ASSERT_EQ(chunks.tail_ms.size(), 2u);
  EXPECT_NEAR(chunks.tail_ms[0], 2 * 0.05 * 8, 1e-12);
  EXPECT_NEAR(chunks.tail_ms[1], 0.05 * 8, 1e-12);
}

// A device's tail runs right after its own list, beside the others' work: where it ends before
// the slowest device's list the step does not grow, as finishing work of the same length does.
TEST(AutoPlan, ATailOverlapsTheOtherDevicesWork) {
  const auto s = schedule::pipeline_schedule(schedule::Kind::GPipe, 2, 4, 1, 1);
  schedule::Costs c = schedule::Costs::uniform(2, 1.0, 1.0, 1.0);
  const double step = schedule::simulate(s, c).makespan_ms;
  c.tail_ms = {0.0, 1.0};  // the last stage ends its list first in GPipe
  EXPECT_NEAR(schedule::simulate(s, c).makespan_ms, step, 1e-12);
  c.tail_ms.clear();
  c.finish_ms = {0.0, 1.0};
  EXPECT_NEAR(schedule::simulate(s, c).makespan_ms, step + 1.0, 1e-12);
}

// The search defers where the flush costs less than the W it saves, never with one
// micro-batch, and counts every micro-batch's stash in the peak; a flush costed on the whole
// batch that outweighs the saving is not chosen (on one micro-batch's rows it would be).
TEST(AutoPlan, DefersWeightGradientsWhereThatPays) {
  SearchSpace s = space();
  s.defer = {false, true};
  DeferringTable cheap(0.01);
  SearchResult r = search_plans(s, [&](int64_t rows, Precision p, int) -> const profiler::Profile& { return cheap(rows, p); });
  const Candidate& best = r.fitting.front();
  EXPECT_TRUE(best.defer);
  EXPECT_EQ(best.stages, 2);
  EXPECT_EQ(best.micro_batches, 8);
  const Candidate* twin = nullptr;
  for (const Candidate& c : r.fitting) {
    EXPECT_FALSE(c.defer && c.micro_batches == 1);
    if (!c.defer && c.stages == best.stages && c.micro_batches == best.micro_batches && c.schedule == best.schedule) twin = &c;
  }
  ASSERT_NE(twin, nullptr);
  EXPECT_LT(best.step_ms, twin->step_ms);
  // Two layers per device, 8 micro-batches of one row, 4 bytes each; and the flush's
  // concatenated copy of one layer's (8 x 4 bytes).
  EXPECT_NEAR(best.max_peak_bytes(), twin->max_peak_bytes() + 2 * 8 * 4 + 8 * 4, 1e-9);
  // 0.2 ms per row: 1.6 ms a layer on the batch's 8 rows against the 0.4 ms its 8 deferred
  // backwards save; costed on one micro-batch's row it would look like 0.2 ms and win.
  DeferringTable costly(0.2);
  r = search_plans(s, [&](int64_t rows, Precision p, int) -> const profiler::Profile& { return costly(rows, p); });
  EXPECT_FALSE(r.fitting.front().defer);
}

// A tie between the first and the last layer (100 bytes) on two stages whose link takes 1 ms
// plus 1 ms per 100 bytes: at the optimizer step the last stage's gradient goes to the first
// and the sum comes back, 2 + 2 ms on both devices; sharded, the two tied stages' reductions
// move from beside the backward to the step; with three copies the first member's value travels
// once more. On one stage nothing travels.
TEST(AutoPlan, TiesAreExchangedAtTheStep) {
  Table t;
  const profiler::Profile& p = t(8, Precision::FP32);
  auto point = [](int stages, int copies, bool sharded, bool tied) {
    PlanPoint pt;
    pt.schedule = schedule::Kind::GPipe;
    pt.stages = stages, pt.micro_batches = 1;
    pt.balance = stages == 2 ? partitioner::Balance{2, 2} : partitioner::Balance{4};
    pt.latency_ms = 1, pt.bytes_per_ms = 100;
    pt.data_parallel.copies = copies, pt.data_parallel.sharded = sharded;
    pt.data_parallel.link.all_reduce = {1.0, 400.0};
    pt.data_parallel.link.reduce_scatter = pt.data_parallel.link.all_gather = {0.5, 800.0};
    if (tied) pt.ties = {partitioner::TieCost{{0, 3}, 100}};
    return pt;
  };
  for (int copies : {1, 2, 3})
    for (bool sharded : {false, true}) {
      if (sharded && copies == 1) continue;
      SCOPED_TRACE(testing::Message() << copies << " copies" << (sharded ? ", sharded" : ""));
      const Prediction plain = predict(point(2, copies, sharded, false), p);
      const Prediction tied = predict(point(2, copies, sharded, true), p);
      const double exchange = sharded && copies >= 3 ? 6.0 : 4.0;
      for (int d = 0; d < 2; ++d) {
        const double before = plain.costs.finish_ms.empty() ? 0.0 : plain.costs.finish_ms[d];
        const double held = sharded ? plain.costs.reduce_ms.at(d) : 0.0;
        EXPECT_NEAR(tied.costs.finish_ms.at(d), before + exchange + held, 1e-12) << "device " << d;
        if (copies > 1) {
          EXPECT_DOUBLE_EQ(tied.costs.reduce_ms.at(d), sharded ? 0.0 : plain.costs.reduce_ms.at(d));
          EXPECT_DOUBLE_EQ(tied.reduce_ms.at(d), plain.reduce_ms.at(d));  // the reduction itself, as reported
        }
      }
      EXPECT_GE(tied.step_ms, plain.step_ms + exchange - 1e-9);
    }
  const Prediction one = predict(point(1, 1, false, true), p);
  EXPECT_NEAR(one.step_ms, predict(point(1, 1, false, false), p).step_ms, 1e-12);
}

// Stages that share a GPU: `plan` says what more than 2 micro-batches cost there, naming the
// stages and the GPU; nothing for stages on GPUs of their own, on the CPU, or for 2 micro-batches.
TEST(Plan, SaysWhatMicroBatchesCostWhereStagesShareAGpu) {
  const c10::Device gpu0(c10::kCUDA, 0), gpu1(c10::kCUDA, 1), cpu(c10::kCPU);
  stages::StageDevices shared;
  shared.per_stage = {gpu1, gpu0, gpu0, gpu0};
  const std::string hint = shared_device_hint(shared, 8);
  EXPECT_NE(hint.find("stages 1, 2, 3 share cuda:0, where they overlap little: each of the 8 micro-batches"),
            std::string::npos)
      << hint;
  EXPECT_NE(hint.find("docs/gpu.md"), std::string::npos) << hint;
  EXPECT_EQ(shared_device_hint(shared, 2), "");
  stages::StageDevices apart;
  apart.per_stage = {gpu0, gpu1};
  EXPECT_EQ(shared_device_hint(apart, 8), "");
  stages::StageDevices host;
  host.per_stage = {cpu, cpu, cpu};
  EXPECT_EQ(shared_device_hint(host, 8), "");
}
