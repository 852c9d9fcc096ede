// The central test: one pipeline step computes the same loss and the same gradient for every
// parameter as one device running the whole batch, for every model family (with dropout),
// stage count, micro-batch count (including uneven splits) and recomputation mode.
//
// Tolerances: in float64 the only difference is summation order (micro-batch partial sums of
// the loss and of the gradients), so the norm-wise relative error stays near 1e-15; 1e-10
// leaves room for that and still catches any real mistake (a wrong micro-batch weight, a
// different dropout mask, a missing gradient contribution are all >= 1e-3). In float32 the
// same reordering costs up to ~1e-5 relative on these small models; 1e-4 is the bound.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "common/rng.h"
#include "models/model.h"
#include "pipeline/pipeline.h"

using namespace pipetrain;
using nlohmann::json;

namespace {

json family_config(const std::string& family) {
  if (family == "mlp") return {{"family", "mlp"}, {"in", 12}, {"width", 16}, {"layers", 4}, {"out", 5}, {"dropout", 0.2}};
  if (family == "cnn")
    return {{"family", "cnn"}, {"image_size", 8}, {"channels", 2}, {"hidden", 8}, {"classes", 3}, {"dropout", 0.3}};
  return {{"family", "gpt"}, {"vocab_size", 11}, {"seq_len", 6}, {"d_model", 8}, {"n_heads", 2},
          {"n_layers", 2}, {"d_ff", 16}, {"dropout", 0.2}};
}

models::Model build(const std::string& family, at::ScalarType dtype) {
  JsonReader r(family_config(family), "model", "test");
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

using Case = std::tuple<std::string, int, int, stages::Recompute, at::ScalarType>;

class Equivalence : public ::testing::TestWithParam<Case> {};

TEST_P(Equivalence, PipelineStepEqualsSingleDeviceStep) {
  const auto [family, stages, micro_batches, recompute, dtype] = GetParam();
  const double tol = dtype == torch::kDouble ? 1e-10 : 1e-4;
  const int64_t batch = 10;  // 3 and 8 micro-batches split it unevenly

  // Reference: the whole batch on one device.
  models::Model ref = build(family, dtype);
  Batch b = make_batch(ref, batch, dtype);
  at::Tensor ref_loss;
  {
    RngContextGuard rng(RngContext{42, 0, 0});
    ref_loss = mean_ce(ref.layers->forward(b.input), b.target);
  }
  ref_loss.backward();
  // Dropout is active: the test means nothing if it dropped nothing.
  ASSERT_GT(family_config(family)["dropout"].get<double>(), 0.0);

  models::Model pip = build(family, dtype);
  pipeline::PipelineOptions o;
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
  const auto& [family, stages, mb, mode, dtype] = info.param;
  return family + "_" + std::to_string(stages) + "stages_" + std::to_string(mb) + "mb_" +
         stages::recompute_name(mode) + (dtype == torch::kDouble ? "_f64" : "_f32");
}

INSTANTIATE_TEST_SUITE_P(
    Float64, Equivalence,
    ::testing::Combine(::testing::Values("mlp", "cnn", "gpt"), ::testing::Values(1, 2, 3, 4),
                       ::testing::Values(1, 2, 3, 8),
                       ::testing::Values(stages::Recompute::Always, stages::Recompute::ExceptLast,
                                         stages::Recompute::Never),
                       ::testing::Values(torch::kDouble)),
    case_name);

INSTANTIATE_TEST_SUITE_P(
    Float32, Equivalence,
    ::testing::Combine(::testing::Values("mlp", "cnn", "gpt"), ::testing::Values(4), ::testing::Values(3),
                       ::testing::Values(stages::Recompute::ExceptLast), ::testing::Values(torch::kFloat)),
    case_name);

}  // namespace
