// The central test: one pipeline step computes the same loss and the same gradient for every
// parameter as one device running the whole batch, for every model family (with dropout),
// schedule (gpipe, 1f1b, interleaved-1f1b with 2 chunks, zb-h1 with its split backward), stage
// count, micro-batch count (including uneven splits) and recomputation mode.
//
// Tolerances: in float64 the only difference is summation order (micro-batch partial sums of
// the loss and of the gradients), so the norm-wise relative error stays near 1e-15; 1e-10
// leaves room for that and still catches any real mistake (a wrong micro-batch weight, a
// different dropout mask, a missing gradient contribution are all >= 1e-3). In float32 the
// same reordering costs up to ~1e-5 relative on these small models; 1e-4 is the bound.
#include <gtest/gtest.h>

#include <algorithm>

#include <torch/torch.h>

#include "common/rng.h"
#include "models/model.h"
#include "pipeline/pipeline.h"
#include "schedule/schedule.h"

using namespace pipetrain;
using nlohmann::json;

namespace {

// Five layers each, or eight for the mlp and gpt when an interleaved schedule needs more
// virtual stages (the cnn has five layers, so it is interleaved on at most two stages).
json family_config(const std::string& family, bool deep = false) {
  if (family == "mlp")
    return {{"family", "mlp"}, {"in", 12}, {"width", 16}, {"layers", deep ? 7 : 4}, {"out", 5}, {"dropout", 0.2}};
  if (family == "cnn")
    return {{"family", "cnn"}, {"image_size", 8}, {"channels", 2}, {"hidden", 8}, {"classes", 3}, {"dropout", 0.3}};
  return {{"family", "gpt"}, {"vocab_size", 11}, {"seq_len", 6}, {"d_model", 8}, {"n_heads", 2},
          {"n_layers", deep ? 5 : 2}, {"d_ff", 16}, {"dropout", 0.2}};
}

models::Model build(const std::string& family, at::ScalarType dtype, bool deep) {
  JsonReader r(family_config(family, deep), "model", "test");
  models::Model m = models::build(r, /*seed=*/42);
  m.layers->to(dtype);
  return m;
}

struct Batch {
  at::Tensor input, target;
};

Batch make_batch(const models::Model& m, int64_t n, at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  std::vector<int64_t> shape{n};
  shape.insert(shape.end(), m.sample_shape.begin(), m.sample_shape.end());
  if (m.token_input)
    return {torch::randint(0, m.classes, shape, gen, torch::kLong), torch::randint(0, m.classes, shape, gen, torch::kLong)};
  return {torch::randn(shape, gen).to(dtype), torch::randint(0, m.classes, {n}, gen, torch::kLong)};
}

at::Tensor mean_ce(const at::Tensor& out, const at::Tensor& target) {
  return torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}), target.reshape({-1}));
}

double rel_error(const at::Tensor& got, const at::Tensor& want) {
  const double denom = std::max(want.norm().item<double>(), 1e-30);
  return (got - want).norm().item<double>() / denom;
}

using Case = std::tuple<std::string, std::string, int, int, Recompute, at::ScalarType>;

class Equivalence : public ::testing::TestWithParam<Case> {};

TEST_P(Equivalence, PipelineStepEqualsSingleDeviceStep) {
  const auto [schedule, family, stages, micro_batches, recompute, dtype] = GetParam();
  const double tol = dtype == torch::kDouble ? 1e-10 : 1e-4;
  const int64_t batch = 10;  // 3 and 8 micro-batches split it unevenly
  const int chunks = schedule::uses_chunks(schedule) ? 2 : 1;
  const bool deep = chunks > 1;

  // Reference: the whole batch on one device.
  models::Model ref = build(family, dtype, deep);
  Batch b = make_batch(ref, batch, dtype);
  at::Tensor ref_loss;
  {
    RngContextGuard rng(RngContext{42, 0, 0});
    ref_loss = mean_ce(ref.layers->forward(b.input), b.target);
  }
  ref_loss.backward();
  // Dropout is active: the test means nothing if it dropped nothing.
  ASSERT_GT(family_config(family)["dropout"].get<double>(), 0.0);

  models::Model pip = build(family, dtype, deep);
  pipeline::PipelineOptions o;
  o.schedule = schedule;
  o.chunks = chunks;
  o.stages = stages;
  o.micro_batches = micro_batches;
  o.recompute = recompute;
  o.seed = 42;
  o.timeout_s = 60;
  pipeline::Pipeline pipe(pip.layers, o, mean_ce);
  const double loss = pipe.forward_backward(b.input, b.target);

  EXPECT_LE(std::abs(loss - ref_loss.item<double>()), tol * std::abs(ref_loss.item<double>()))
      << "pipeline loss " << loss << " vs " << ref_loss.item<double>();
  auto want = ref.layers->named_parameters();
  auto got = pip.layers->named_parameters();
  ASSERT_EQ(want.size(), got.size());
  for (const auto& p : want) {
    const at::Tensor& g = got[p.key()].grad();
    ASSERT_TRUE(g.defined()) << p.key() << " has no gradient";
    EXPECT_LE(rel_error(g, p.value().grad()), tol) << p.key();
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto& [schedule, family, stages, mb, mode, dtype] = info.param;
  std::string kind = schedule;
  std::replace(kind.begin(), kind.end(), '-', '_');
  return kind + "_" + family + "_" + std::to_string(stages) + "stages_" + std::to_string(mb) + "mb_" +
         recompute_name(mode) + (dtype == torch::kDouble ? "_f64" : "_f32");
}

const Recompute kModes[] = {Recompute::Always, Recompute::ExceptLast,
                                     Recompute::Never};

// Every schedule x family x stage count 1-4 x recomputation mode. Micro-batches: 1, 2, 3 and 8
// (3 and 8 split the batch of 10 unevenly); interleaved-1f1b needs a multiple of the stage
// count, so it runs K and 2K.
std::vector<Case> float64_cases() {
  std::vector<Case> cases;
  for (const std::string schedule : {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1"})
    for (const std::string family : {"mlp", "cnn", "gpt"})
      for (int k = 1; k <= 4; ++k) {
        std::vector<int> mbs{1, 2, 3, 8};
        if (schedule::uses_chunks(schedule)) {
          if (family == "cnn" && k > 2) continue;
          mbs = {k, 2 * k};
        }
        for (int m : mbs)
          for (auto mode : kModes) cases.emplace_back(schedule, family, k, m, mode, torch::kDouble);
      }
  return cases;
}

std::vector<Case> float32_cases() {
  std::vector<Case> cases;
  for (const std::string schedule : {"gpipe", "1f1b", "zb-h1"})
    for (const std::string family : {"mlp", "cnn", "gpt"})
      cases.emplace_back(schedule, family, 4, 3, Recompute::ExceptLast, torch::kFloat);
  for (const std::string family : {"mlp", "gpt"})
    cases.emplace_back("interleaved-1f1b", family, 2, 4, Recompute::ExceptLast, torch::kFloat);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Float64, Equivalence, ::testing::ValuesIn(float64_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Float32, Equivalence, ::testing::ValuesIn(float32_cases()), case_name);

}  // namespace
