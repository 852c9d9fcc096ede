#include <gtest/gtest.h>

#include <torch/script.h>
#include <torch/torch.h>

#include "common/error.h"
#include "models/model.h"
#include "stages/library_warnings.h"
#include "stages/stage.h"
#include "tests/helpers.h"

using namespace pipetrain;
using nlohmann::json;

namespace {
torch::nn::Sequential mlp(uint64_t seed) {
  JsonReader r(json{{"family", "mlp"}, {"in", 6}, {"width", 8}, {"layers", 2}, {"out", 3}, {"dropout", 0.5}},
               "model", "t");
  auto m = models::build(r, seed).layers;
  m->to(torch::kDouble);
  return m;
}
// Gradients of a single (last and first) stage over `micro_batches` micro-batches.
std::vector<at::Tensor> grads(Recompute mode, int micro_batches, size_t* held_after_forward) {
  auto model = mlp(1);
  stages::Stage s(0, 1, model, mode);
  s.set_loss(pipetrain::test::mean_cross_entropy);
  s.begin_step(5, 0, micro_batches);
  auto x = torch::randn({8, 6}, torch::dtype(torch::kDouble).requires_grad(false));
  auto y = torch::randint(0, 3, {8}, torch::kLong);
  auto xs = x.tensor_split(micro_batches), ys = y.tensor_split(micro_batches);
  for (int m = 0; m < micro_batches; ++m) s.forward(m, xs[m], m * (8 / micro_batches), ys[m], 1.0 / micro_batches);
  *held_after_forward = s.held();
  for (int m = micro_batches - 1; m >= 0; --m) s.backward(m, {});
  EXPECT_EQ(s.held(), 0u);
  std::vector<at::Tensor> g;
  for (auto& p : model->parameters()) g.push_back(p.grad().clone());
  return g;
}
}  // namespace

TEST(Stage, RecomputationGivesIdenticalGradientsWithDropout) {
  torch::manual_seed(0);
  size_t held = 0;
  auto never = grads(Recompute::Never, 4, &held);
  torch::manual_seed(0);
  auto always = grads(Recompute::Always, 4, &held);
  ASSERT_EQ(never.size(), always.size());
  for (size_t i = 0; i < never.size(); ++i) EXPECT_TRUE(torch::equal(never[i], always[i])) << i;
}

TEST(Stage, CheckpointPolicyPerMicroBatch) {
  auto model = mlp(1);
  stages::Stage a(0, 2, model, Recompute::ExceptLast);
  a.begin_step(0, 0, 3);
  EXPECT_TRUE(a.recomputes(0));
  EXPECT_TRUE(a.recomputes(1));
  EXPECT_FALSE(a.recomputes(2));
  stages::Stage b(0, 2, model, Recompute::Never);
  b.begin_step(0, 0, 3);
  EXPECT_FALSE(b.recomputes(0));
  EXPECT_EQ(parse_recompute("always"), Recompute::Always);
  EXPECT_THROW(parse_recompute("sometimes"), ConfigError);
}

TEST(Stage, CheckpointedForwardKeepsNoGraph) {
  auto model = mlp(1);
  stages::Stage s(0, 2, model, Recompute::Always);
  s.begin_step(0, 0, 1);
  auto out = s.forward(0, torch::randn({2, 6}, torch::kDouble), 0);
  EXPECT_FALSE(out.requires_grad());
  EXPECT_EQ(out.grad_fn(), nullptr);
}

// The last stage returns the micro-batch's weighted loss; a weight of exactly 1 (one
// micro-batch) is the loss itself, with no multiply in the graph (as the plain loop's).
TEST(Stage, AUnitWeightLeavesTheLossAsItIs) {
  for (double weight : {1.0, 0.5}) {
    auto model = mlp(1);
    stages::Stage s(0, 1, model, Recompute::Never);
    at::Tensor loss;
    s.set_loss([&loss](const at::Tensor& out, const at::Tensor& t) { return loss = pipetrain::test::mean_cross_entropy(out, t); });
    s.begin_step(0, 0, 1);
    const at::Tensor out = s.forward(0, torch::randn({4, 6}, torch::kDouble), 0, torch::randint(0, 3, {4}), weight);
    EXPECT_EQ(out.data_ptr() == loss.data_ptr(), weight == 1.0) << weight;
    EXPECT_EQ(out.item<double>(), loss.item<double>() * weight);
    s.backward(0, {});
    for (auto& p : model->parameters()) EXPECT_TRUE(p.grad().defined());
  }
}

TEST(Stage, MiddleStageReturnsInputGradient) {
  auto model = mlp(1);
  stages::Stage s(1, 3, model, Recompute::Never);
  s.begin_step(0, 0, 1);
  auto out = s.forward(0, torch::randn({2, 6}, torch::kDouble), 0);
  auto g = s.backward(0, torch::ones_like(out));
  ASSERT_TRUE(g.defined());
  EXPECT_EQ(g.sizes(), (std::vector<int64_t>{2, 6}));
}

TEST(Stage, BackwardWithoutForwardIsAnInternalError) {
  auto model = mlp(1);
  stages::Stage s(0, 2, model, Recompute::Never);
  s.begin_step(0, 0, 2);
  EXPECT_THROW(s.backward(1, torch::ones({1, 8})), InternalError);
}

// The zero-bubble split on a middle stage (input needs a gradient, output gradient given):
// B gives the same input gradient as the fused backward and leaves every weight gradient
// untouched; W then gives the same weight gradients; with several micro-batches in flight the
// Ws may come in any order.
TEST(Stage, SplitBackwardEqualsFusedBackward) {
  for (auto mode : {Recompute::Never, Recompute::Always}) {
    auto fused_model = mlp(3), split_model = mlp(3);
    stages::Stage fused(1, 3, fused_model, mode), split(1, 3, split_model, mode);
    fused.begin_step(9, 0, 2);
    split.begin_step(9, 0, 2);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
    auto x = torch::randn({6, 6}, gen).to(torch::kDouble);
    auto g = torch::randn({6, 3}, gen).to(torch::kDouble);
    auto xs = x.tensor_split(2), gs = g.tensor_split(2);
    for (int m = 0; m < 2; ++m) {
      fused.forward(m, xs[m], 3 * m);
      split.forward(m, xs[m], 3 * m);
    }
    std::vector<at::Tensor> want_in, got_in;
    for (int m = 0; m < 2; ++m) {
      want_in.push_back(fused.backward(m, gs[m]));
      got_in.push_back(split.backward_input(m, gs[m]));
    }
    EXPECT_EQ(split.held(), 0u);
    EXPECT_EQ(split.awaiting_weight(), 2u);
    for (auto& p : split_model->parameters()) EXPECT_FALSE(p.grad().defined()) << "B computed a weight gradient";
    split.backward_weight(1);
    split.backward_weight(0);
    EXPECT_EQ(split.awaiting_weight(), 0u);
    for (int m = 0; m < 2; ++m) EXPECT_TRUE(torch::allclose(got_in[m], want_in[m], 1e-12, 1e-12)) << m;
    auto want = fused_model->named_parameters();
    auto got = split_model->named_parameters();
    for (const auto& p : want) {
      ASSERT_TRUE(got[p.key()].grad().defined()) << p.key();
      EXPECT_TRUE(torch::allclose(got[p.key()].grad(), p.value().grad(), 1e-12, 1e-12)) << p.key();
    }
  }
}

TEST(Stage, SplitBackwardOnTheFirstStageRunsEverythingInW) {
  auto model = mlp(3);
  stages::Stage s(0, 2, model, Recompute::Never);
  s.begin_step(0, 0, 1);
  auto out = s.forward(0, torch::randn({2, 6}, torch::kDouble), 0);
  EXPECT_FALSE(s.backward_input(0, torch::ones_like(out)).defined());
  for (auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
  s.backward_weight(0);
  for (auto& p : model->parameters()) EXPECT_TRUE(p.grad().defined());
  EXPECT_THROW(s.backward_weight(0), InternalError);
}

namespace {

// libtorch's warnings reach the user as one line each, once, without the library's source file.
TEST(LibraryWarnings, OneLineEachOnceWithoutTheSource) {
  pipetrain::stages::route_library_warnings();
  testing::internal::CaptureStderr();
  TORCH_WARN("a library warning\n  with a second line");
  TORCH_WARN("a library warning\n  with a second line");
  TORCH_WARN("another one");
  const std::string err = testing::internal::GetCapturedStderr();
  const std::string line = "warning: libtorch: a library warning\n";
  const size_t at = err.find(line);
  ASSERT_NE(at, std::string::npos) << err;
  EXPECT_EQ(err.find(line, at + 1), std::string::npos) << "said twice: " << err;
  EXPECT_NE(err.find("warning: libtorch: another one\n"), std::string::npos) << err;
  EXPECT_EQ(err.find("second line"), std::string::npos) << err;
  EXPECT_EQ(err.find(".cpp"), std::string::npos) << err;
  EXPECT_EQ(pipetrain::stages::library_message_line("first\nsecond"), "first");
}

}  // namespace

// A TorchScript interpreter's error, raised by libtorch itself: the line shown is its cause, not
// the interpreter's generic header.
TEST(LibraryWarnings, AScriptErrorShowsItsCause) {
  auto unit = torch::jit::compile("def f(x):\n    return torch.mm(x, x)\n");
  std::string shown, type;
  try {
    unit->run_method("f", torch::zeros({2, 3}));
  } catch (const c10::Error& e) {
    type = "c10::Error";
    shown = pipetrain::stages::library_message_line(e.what_without_backtrace());
  } catch (const std::exception& e) {
    type = "std::exception";
    shown = pipetrain::stages::library_message_line(e.what());
  }
  EXPECT_EQ(shown, "mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3) (in TorchScript)") << type;
  EXPECT_EQ(type, "std::exception");  // not a c10::Error: the executor catches it as well
  EXPECT_EQ(pipetrain::stages::library_message_line("The following operation failed in the TorchScript interpreter.\nno cause"),
            "The following operation failed in the TorchScript interpreter.");
}
