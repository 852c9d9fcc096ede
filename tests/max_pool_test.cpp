// models/max_pool.h: the 2 x 2 max pool gives libtorch's results bit for bit, forward and
// backward, on ties, NaN, infinities, odd sizes and every floating dtype, and refuses a second
// derivative by name; the CNN's block pools before its ReLU and still equals libtorch's
// relu-then-pool.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "models/layers.h"
#include "models/max_pool.h"

using namespace pipetrain;

namespace {

// Equal bit for bit where both are numbers, NaN in the same places.
void expect_same(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  EXPECT_TRUE(torch::equal(torch::isnan(got), torch::isnan(want))) << what;
  EXPECT_TRUE(torch::equal(torch::nan_to_num(got, 0.0, 1e300, -1e300), torch::nan_to_num(want, 0.0, 1e300, -1e300)))
      << what;
}

// Values with many ties (small integers, a plane of zeros), NaN and infinities.
at::Tensor awkward(std::vector<int64_t> sizes, at::ScalarType dtype, bool specials) {
  at::Tensor x = torch::randint(-2, 3, sizes, torch::kDouble);
  x.select(-3, 0).zero_();  // a whole plane tied, as a blank image region after a ReLU
  if (specials) {
    auto flat = x.view({-1});
    const int64_t n = flat.numel();
    flat[1 % n] = std::nan("");
    flat[6 % n] = std::numeric_limits<double>::infinity();
    flat[9 % n] = -std::numeric_limits<double>::infinity();
    flat[n - 2] = std::nan("");
  }
  return x.to(dtype);
}

}  // namespace

TEST(MaxPool2x2, MatchesLibtorchBitForBitForwardAndBackward) {
  torch::manual_seed(3);
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kHalf})
    for (std::vector<int64_t> sizes : {std::vector<int64_t>{3, 4, 8, 6}, {2, 3, 5, 7}, {4, 6, 6}, {1, 1, 2, 2}})
      for (bool specials : {false, true}) {
        const std::string what = std::string(c10::toString(dtype)) + " " + c10::str(sizes) + (specials ? " nan/inf" : "");
        const at::Tensor x = awkward(sizes, dtype, specials);
        const at::Tensor a = x.clone().requires_grad_(true), b = x.clone().requires_grad_(true);
        const at::Tensor ours = models::max_pool2x2(a), theirs = torch::max_pool2d(b, 2);
        expect_same(ours, theirs, what + " forward");
        const at::Tensor g = torch::randn(theirs.sizes(), torch::kDouble).to(dtype);
        ours.backward(g);
        theirs.backward(g);
        expect_same(a.grad(), b.grad(), what + " backward");
      }
}

TEST(MaxPool2x2, ASecondDerivativeIsRefusedByName) {
  const at::Tensor x = torch::randn({1, 2, 4, 4}, torch::kDouble).requires_grad_(true);
  const at::Tensor y = models::max_pool2x2(x).pow(2).sum();
  try {
    torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_pool2x2: its gradient cannot be differentiated again"), std::string::npos)
        << e.what();
  }
  const auto g = torch::autograd::grad({y}, {x});  // once is fine
  EXPECT_TRUE(torch::equal(g[0], torch::autograd::grad({torch::max_pool2d(x, 2).pow(2).sum()}, {x})[0]));
}

TEST(MaxPool2x2, OtherLayoutsAndNoGradientAgreeToo) {
  torch::manual_seed(4);
  const at::Tensor x = awkward({2, 3, 6, 8}, torch::kFloat, true);
  expect_same(models::max_pool2x2(x.contiguous(at::MemoryFormat::ChannelsLast)), torch::max_pool2d(x, 2), "channels last");
  expect_same(models::max_pool2x2(x.transpose(2, 3)), torch::max_pool2d(x.transpose(2, 3), 2), "a transposed view");
  torch::NoGradGuard no_grad;
  expect_same(models::max_pool2x2(x), torch::max_pool2d(x, 2), "no gradient");
}

// ConvBlock computes relu(pool(conv x)): equal, values and every gradient, to libtorch's
// pool(relu(conv x)) on an input with blank regions (ties at the bias' ReLU) and negative ones.
TEST(MaxPool2x2, TheConvBlockPoolsBeforeItsReluWithTheSameResults) {
  torch::manual_seed(5);
  for (auto dtype : {torch::kDouble, torch::kFloat}) {
    models::ConvBlock block(2, 3, /*pool=*/true, /*batch_norm=*/false);
    block->to(dtype);
    at::Tensor x = torch::randn({4, 2, 8, 8}, dtype);
    x.slice(2, 0, 4).zero_();  // blank rows: every window there ties
    x.slice(3, 4, 8).fill_(-1.0);
    const at::Tensor xa = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
    const at::Tensor g = torch::randn({4, 3, 4, 4}, dtype);
    const at::Tensor ya = block->forward(xa);
    ya.backward(g);
    std::vector<at::Tensor> ours;
    for (const auto& p : block->parameters()) ours.push_back(p.grad().clone()), p.mutable_grad().reset();
    auto* conv = block->named_modules()["conv"]->as<torch::nn::Conv2dImpl>();
    ASSERT_NE(conv, nullptr);
    const at::Tensor yb = torch::max_pool2d(torch::relu(conv->forward(xb)), 2);
    yb.backward(g);
    expect_same(ya, yb, "output");
    expect_same(xa.grad(), xb.grad(), "input gradient");
    const auto params = block->parameters();
    for (size_t i = 0; i < params.size(); ++i) expect_same(ours[i], params[i].grad(), "parameter " + std::to_string(i));
  }
}
