// Gradient accumulation over batches, and deferred weight gradients in the engine
// (PipelineOptions::defer_weight_grads, models/weight_grads.h): accumulation with them, the
// flush in the trace and the measured costs, the refusal of GPU stages. The equivalence grid's
// `equivalence.deferred` covers every schedule, runtime and recomputation mode; models_test the
// stash itself.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "common/error.h"
#include "models/layers.h"
#include "pipeline/pipeline.h"
#include "profiler/profile.h"
#include "tests/helpers.h"

using namespace pipetrain;
using namespace pipetrain::pipeline;

namespace {

using pipetrain::test::mean_cross_entropy;

// models::Dense layers (whose linear can defer its weight gradient), float64.
torch::nn::Sequential dense64(int width, int layers) {
  torch::manual_seed(0);
  torch::nn::Sequential s;
  for (int i = 0; i < layers; ++i) s->push_back("fc" + std::to_string(i), models::Dense(width, width, true));
  s->to(torch::kDouble);
  return s;
}

}  // namespace

// Two half batches accumulated equal one batch, with the weight gradients added micro-batch by
// micro-batch and deferred (the second batch's flush adds into the first's gradients).
TEST(Controls, AccumulatedBatchesEqualOneBigBatch) {
  for (bool defer : {false, true}) {
    auto ref = dense64(8, 4), pip = dense64(8, 4);
    auto x = torch::randn({12, 8}, torch::kDouble);
    auto y = torch::randint(0, 8, {12}, torch::kLong);
    mean_cross_entropy(ref->forward(x), y).backward();
    PipelineOptions o;
    o.stages = 3;
    o.micro_batches = 3;
    o.schedule = schedule::parse_kind("1f1b");
    o.defer_weight_grads = defer;
    o.defer_min_bytes = 0;
    Pipeline pipe(pip, o, mean_cross_entropy);
    const double l1 = pipe.forward_backward(x.slice(0, 0, 6), y.slice(0, 0, 6), false, 0.5);
    const double l2 = pipe.forward_backward(x.slice(0, 6, 12), y.slice(0, 6, 12), true, 0.5);
    EXPECT_NEAR(l1 + l2, mean_cross_entropy(ref->forward(x), y).item<double>(), 1e-12);
    auto want = ref->parameters(), got = pip->parameters();
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_LE((got[i].grad() - want[i].grad()).norm().item<double>(), 1e-10 * want[i].grad().norm().item<double>())
          << i << (defer ? ", deferred" : "");
  }
}

// Each stage's flush is one W span of no micro-batch at the end of its list: the breakdown counts
// it as W compute and still tiles the step, and the measured costs charge it at the device's end
// with the optimizer step. GPU stages are refused.
TEST(DeferredWeightGrads, OneTracedFlushPerStage) {
  PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 4;
  o.schedule = schedule::parse_kind("1f1b");
  o.recompute = Recompute::Never;
  o.defer_weight_grads = true;
  o.defer_min_bytes = 0;
  Pipeline pipe(dense64(8, 4), o, mean_cross_entropy);
  pipe.forward_backward(torch::randn({16, 8}, torch::kDouble), torch::randint(0, 8, {16}, torch::kLong));
  const StepTrace& t = pipe.last_trace();
  for (const auto& spans : t.spans) {
    int flushes = 0;
    for (const Span& sp : spans) flushes += sp.op == schedule::Op::BackwardWeight;
    EXPECT_EQ(flushes, 1);
    EXPECT_EQ(spans.back().op, schedule::Op::BackwardWeight);
    EXPECT_EQ(spans.back().micro_batch, -1);
  }
  const auto b = breakdown(t);
  for (size_t r = 0; r < b.size(); ++r) {
    EXPECT_GT(b[r].backward_weight, 0.0) << r;
    EXPECT_NEAR(b[r].total(), t.wall, 1e-9) << r;
  }
  const auto c = measured_costs(t, pipe.schedule());
  ASSERT_EQ(c.tail_ms.size(), t.spans.size());
  for (size_t r = 0; r < c.tail_ms.size(); ++r)  // the flush: right after the device's own list
    EXPECT_NEAR(c.tail_ms[r], (t.spans[r].back().end - t.spans[r].back().start) * 1e3, 1e-9) << r;
  EXPECT_NO_THROW(schedule::simulate(pipe.schedule(), c));

  o.devices = {c10::Device(c10::kCUDA, 0)};
  try {
    Pipeline gpu(dense64(8, 4), o, mean_cross_entropy);
    ADD_FAILURE() << "GPU stages with deferred weight gradients were accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("defer_weight_grads works on CPU stages only"), std::string::npos) << e.what();
  }
}

// Only weights of at least defer_min_bytes (1 MiB by default) are deferred: a model of small
// layers flushes nothing; one with a 2 MiB layer (512 x 512 float64) defers that layer alone and
// still equals the reference.
TEST(DeferredWeightGrads, SmallWeightsAreNotDeferred) {
  PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 2;
  o.schedule = schedule::parse_kind("1f1b");
  o.defer_weight_grads = true;
  EXPECT_EQ(o.defer_min_bytes, 1 << 20);
  Pipeline small(dense64(8, 4), o, mean_cross_entropy);
  small.forward_backward(torch::randn({4, 8}, torch::kDouble), torch::randint(0, 8, {4}, torch::kLong));
  for (const auto& spans : small.last_trace().spans)
    for (const Span& sp : spans) EXPECT_NE(sp.op, schedule::Op::BackwardWeight);

  auto mixed = [] {
    torch::manual_seed(1);
    torch::nn::Sequential s;
    s->push_back("big", models::Dense(512, 512, true));
    s->push_back("small", models::Dense(512, 8, false));
    s->to(torch::kDouble);
    return s;
  };
  auto ref = mixed(), pip = mixed();
  auto x = torch::randn({6, 512}, torch::kDouble);
  auto y = torch::randint(0, 8, {6}, torch::kLong);
  mean_cross_entropy(ref->forward(x), y).backward();
  Pipeline pipe(pip, o, mean_cross_entropy);
  pipe.forward_backward(x, y);
  const auto& spans = pipe.last_trace().spans;
  EXPECT_EQ(spans[0].back().op, schedule::Op::BackwardWeight);  // the big layer's stage
  for (const Span& sp : spans[1]) EXPECT_NE(sp.op, schedule::Op::BackwardWeight);
  auto want = ref->parameters(), got = pip->parameters();
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_LE((got[i].grad() - want[i].grad()).norm().item<double>(), 1e-10 * want[i].grad().norm().item<double>()) << i;
}

// The profiler's deferred pass (profiler::ProfileOptions::defer_min_bytes): per layer, what its
// stash keeps for one micro-batch (each linear's input and output gradient: rows x (in + out)
// floats), the deferred backward and the flush; nothing where no weight is large enough, or
// where the pass is off.
TEST(DeferredWeightGrads, TheProfilerMeasuresWhatTheStashKeeps) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  model->push_back("fc0", models::Dense(12, 8, true));
  model->push_back("fc1", models::Dense(8, 8, true));
  model->push_back("head", models::Dense(8, 3, false));
  const at::Tensor x = torch::randn({6, 12}), y = torch::randint(0, 3, {6}, torch::kLong);
  profiler::ProfileOptions o;
  o.warmup = 1, o.repeat = 2;
  o.defer_min_bytes = 0;
  const profiler::Profile p = profiler::profile_layers(model, x, y, mean_cross_entropy, o);
  ASSERT_EQ(p.deferred_bytes.size(), 3u);
  ASSERT_EQ(p.deferred_backward_ms.size(), 3u);
  ASSERT_EQ(p.flush_ms.size(), 3u);
  EXPECT_EQ(p.deferred_bytes[0], 6 * (12 + 8) * 4);
  EXPECT_EQ(p.deferred_bytes[1], 6 * (8 + 8) * 4);
  EXPECT_EQ(p.deferred_bytes[2], 6 * (8 + 3) * 4);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_GT(p.flush_ms[i], 0.0) << i;  // timed: a GEMM ran
    EXPECT_GT(p.deferred_backward_ms[i], 0.0) << i;
  }
  for (auto& param : model->parameters()) EXPECT_FALSE(param.grad().defined()) << "the flush's gradients are cleared too";
  o.defer_min_bytes = 8 * 8 * 4 + 1;  // fc0's 384 bytes only
  const profiler::Profile only = profiler::profile_layers(model, x, y, mean_cross_entropy, o);
  ASSERT_EQ(only.deferred_bytes.size(), 3u);
  EXPECT_EQ(only.deferred_bytes[0], 6 * (12 + 8) * 4);
  EXPECT_EQ(only.deferred_bytes[1], 0);
  EXPECT_EQ(only.deferred_bytes[2], 0);
  o.defer_min_bytes = 1 << 20;  // no weight that large: no pass
  EXPECT_TRUE(profiler::profile_layers(model, x, y, mean_cross_entropy, o).deferred_bytes.empty());
  o.defer_min_bytes = -1;
  EXPECT_TRUE(profiler::profile_layers(model, x, y, mean_cross_entropy, o).deferred_bytes.empty());
}
