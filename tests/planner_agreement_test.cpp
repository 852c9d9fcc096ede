// `plan` and `plan --auto` on the same candidate: configurations built at random (seeded), each
// planned on a random cost file by make_plan (plan --costs) and by auto_plan (plan --auto
// --costs); the auto-planner's row for the configured candidate must give the same balance,
// step, bubble, peak per device and reductions as the plan.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "job/config.h"
#include "partitioner/cost_file.h"
#include "planner/autoplan.h"
#include "planner/plan.h"
#include "schedule/kinds.h"

using namespace pipetrain;
using nlohmann::json;

namespace {

constexpr int kCases = 200;

struct Case {
  json config;
  partitioner::CostFile costs;
};

// A configuration the auto-planner searches (its micro-batch counts, chunk counts, balance
// methods) on a layer list of `layers` linear layers, with a cost file of as many layers whose
// costs are for the configuration's micro-batch rows.
Case random_case(std::mt19937& rng) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto real = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  const auto kinds = schedule::all_kinds();
  for (;;) {
    const int layers = pick(3, 8), K = pick(1, 3), D = pick(1, 2), M = 1 << pick(0, 3), rows = pick(1, 3);
    const schedule::Kind kind = K == 1 ? schedule::Kind::GPipe : kinds[pick(0, static_cast<int>(kinds.size()) - 1)];
    const schedule::KindInfo& info = schedule::info(kind);
    const int chunks = info.min_chunks == info.max_chunks ? info.min_chunks : (pick(0, 1) ? 2 : 4);
    if (chunks < info.min_chunks || chunks > info.max_chunks || K * chunks > layers) continue;
    try {
      schedule::check_supported(kind, K, M, chunks);
    } catch (const ScheduleError&) {
      continue;
    }
    Case c;
    json list = json::array();
    for (int i = 0; i < layers; ++i)
      list.push_back({{"name", "l" + std::to_string(i)}, {"type", "linear"}, {"in_features", 4},
                      {"out_features", i + 1 == layers ? 3 : 4}});
    const char* methods[] = {"uniform", "parameters", "time"};
    const char* recompute[] = {"never", "except_last", "always"};
    c.config = {{"model", {{"family", "layers"}, {"input_shape", {4}}, {"layers", list}}},
                {"data", {{"kind", "synthetic"}, {"batch_size", D * M * rows}, {"samples", 64}, {"test_samples", 8}}},
                {"pipeline",
                 {{"stages", K}, {"micro_batches", M}, {"schedule", schedule::name(kind)}, {"chunks", chunks},
                  {"recompute", recompute[pick(0, 2)]}, {"balance", methods[pick(0, 2)]}, {"data_parallel", D}}},
                {"optimizer", pick(0, 1) ? json{{"kind", "adam"}, {"lr", 0.001}} : json{{"kind", "sgd"}, {"lr", 0.01}, {"momentum", 0.9}}},
                {"train", {{"steps", 1}, {"shard_optimizer", D > 1 && pick(0, 1)}, {"precision", pick(0, 1) ? "bf16" : "fp32"}}},
                {"runtime", {{"intra_op_threads", 1}}}};
    c.costs.bandwidth_gb_s = real(1, 50);
    c.costs.latency_ms = real(0, 0.05);
    c.costs.micro_batch = rows;
    c.costs.input_bytes = rows * 16;
    c.costs.split_given = true;
    for (int i = 0; i < layers; ++i) {
      partitioner::LayerCost l;
      l.name = "l" + std::to_string(i);
      l.forward_ms = real(0.1, 2);
      l.backward_input_ms = real(0.1, 2), l.backward_weight_ms = real(0.1, 2);
      l.backward_ms = l.backward_input_ms + l.backward_weight_ms;
      l.param_bytes = pick(1000, 1000000);
      l.activation_bytes = pick(100, 100000), l.saved_bytes = pick(100, 400000), l.workspace_bytes = pick(0, 50000);
      c.costs.layers.push_back(l);
    }
    return c;
  }
}

const planner::Candidate* configured(const planner::AutoPlanReport& a, const job::Config& c) {
  for (const auto& x : a.result.fitting)
    if (x.stages == c.pipeline.stages && x.micro_batches == c.pipeline.micro_batches && x.chunks == c.pipeline.chunks &&
        x.data_parallel == c.pipeline.data_parallel && x.sharded == (c.train.shard_optimizer && c.pipeline.data_parallel > 1) &&
        x.schedule == c.pipeline.schedule && x.recompute == c.pipeline.recompute && x.precision == c.train.precision &&
        x.balance_method == c.pipeline.balance_method && !x.defer && x.threads == 1)
      return &x;
  return nullptr;
}

}  // namespace

TEST(PlannerAgreement, PlanAndAutoPlanAgreeOnEveryFigureOfRandomConfigurations) {
  std::mt19937 rng(53);
  const std::string dir = ::testing::TempDir() + "/pipetrain_agreement_" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  int compared = 0;
  for (int n = 0; n < kCases; ++n) {
    const Case k = random_case(rng);
    const std::string path = dir + "/costs" + std::to_string(n) + ".json";
    {
      std::ofstream out(path);
      partitioner::write_cost_file(out, k.costs);
    }
    const job::Config c = job::parse_config(k.config, "case" + std::to_string(n));
    SCOPED_TRACE(k.config.dump());
    planner::PlanOptions po;
    po.costs_path = path;
    const planner::PlanReport plan = planner::make_plan(c, po);
    planner::AutoPlanOptions ao;
    ao.costs_path = path;
    ao.devices = c.pipeline.stages * c.pipeline.data_parallel;
    ao.memory_headroom = 0;
    const planner::AutoPlanReport autoplan = planner::auto_plan(c, ao);
    const planner::Candidate* row = configured(autoplan, c);
    ASSERT_NE(row, nullptr) << "plan --auto has no row for the configured candidate";
    const double rel = 1e-9;
    EXPECT_EQ(row->balance, plan.balance);
    EXPECT_NEAR(row->step_ms, plan.configured.step_ms, rel * plan.configured.step_ms);
    EXPECT_NEAR(row->bubble, plan.configured.bubble, 1e-9);
    EXPECT_NEAR(row->max_peak_bytes(), static_cast<double>(plan.configured.peak_bytes), 1.0);
    ASSERT_EQ(row->peak_bytes.size(), plan.configured.device_peak_bytes.size());
    for (size_t d = 0; d < row->peak_bytes.size(); ++d) {
      EXPECT_DOUBLE_EQ(row->peak_bytes[d], plan.configured.device_peak_bytes[d]) << "device " << d;
      for (const auto& stage : plan.stages)  // the stage table shows its device's peak
        if (stage.stage == static_cast<int>(d)) EXPECT_NEAR(static_cast<double>(stage.peak_bytes), row->peak_bytes[d], 1.0);
    }
    double exposed = 0;
    for (double e : plan.simulation.exposed_reduce_ms) exposed = std::max(exposed, e);
    EXPECT_NEAR(row->exposed_reduce_ms, exposed, 1e-9 + rel * exposed);
    EXPECT_EQ(row->samples_per_s > 0, plan.configured.step_ms > 0);
    ++compared;
  }
  std::printf("plan and plan --auto compared on %d random configurations\n", compared);
  EXPECT_EQ(compared, kCases);
}
