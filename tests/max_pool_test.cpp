// models/max_pool.h: the 2 x 2 max pool gives libtorch's results bit for bit, forward and
// backward (signed zeros and NaN's sign included), on ties, NaN, infinities, odd sizes, every
// floating dtype and layout; its second derivative is libtorch's too; the CNN's block keeps
// libtorch's values and gradients bit for bit.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "models/layers.h"
#include "models/max_pool.h"

using namespace pipetrain;

namespace {

// The same bits, element by element (a NaN's sign and payload, a zero's sign included).
void expect_same(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  const auto bits = [](const at::Tensor& t) {
    const auto as = t.element_size() == 8 ? at::kLong : t.element_size() == 4 ? at::kInt : at::kShort;
    return t.contiguous().view(as);
  };
  EXPECT_TRUE(torch::equal(bits(got), bits(want))) << what;
}

// Values with many ties (small integers, a plane of zeros, zeros of both signs), NaN of both
// signs (two in one window: which one wins shows), and infinities.
at::Tensor awkward(std::vector<int64_t> sizes, at::ScalarType dtype, bool specials) {
  at::Tensor x = torch::randint(-2, 3, sizes, torch::kDouble);
  x.select(-3, 0).zero_();  // a whole plane tied, as a blank image region after a ReLU
  auto flat = x.view({-1});
  const int64_t n = flat.numel();
  for (int64_t i = 2; i < n; i += 5) flat[i] = -0.0;  // beside +0.0 in some windows, before or after it
  if (specials) {
    flat[0] = -std::nan("");  // row 0 of the first window
    flat[1] = std::nan("");   // and its neighbour: the later NaN is the one libtorch keeps
    flat[6 % n] = std::numeric_limits<double>::infinity();
    flat[9 % n] = -std::numeric_limits<double>::infinity();
    flat[n - 2] = std::nan("");
  }
  return x.to(dtype);
}

// An output gradient with zeros of both signs.
at::Tensor gradient_like(const at::Tensor& y) {
  at::Tensor g = torch::randn(y.sizes(), torch::kDouble);
  auto flat = g.view({-1});
  for (int64_t i = 0; i < flat.numel(); i += 3) flat[i] = -0.0;
  for (int64_t i = 1; i < flat.numel(); i += 7) flat[i] = 0.0;
  return g.to(y.scalar_type());
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
        const at::Tensor g = gradient_like(theirs);
        ours.backward(g);
        theirs.backward(g);
        expect_same(a.grad(), b.grad(), what + " backward");
      }
}

// A graph of the backward (create_graph): the gradient and the second derivative are libtorch's.
TEST(MaxPool2x2, ASecondDerivativeIsLibtorchs) {
  torch::manual_seed(6);
  const at::Tensor x = awkward({2, 3, 6, 4}, torch::kDouble, false);
  std::vector<at::Tensor> second;
  for (bool ours : {true, false}) {
    const at::Tensor xi = x.clone().requires_grad_(true);
    const at::Tensor y = (ours ? models::max_pool2x2(xi) : torch::max_pool2d(xi, 2)).pow(3).sum();
    const at::Tensor g = torch::autograd::grad({y}, {xi}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    EXPECT_TRUE(g.requires_grad());
    second.push_back(torch::autograd::grad({g.pow(2).sum()}, {xi})[0]);
    second.push_back(g.detach());
  }
  expect_same(second[1], second[3], "gradient under create_graph");
  expect_same(second[0], second[2], "second derivative");
}

// Layouts the loop does not take (channels last, a transposed view) and no gradient at all give
// libtorch's results too.
TEST(MaxPool2x2, OtherLayoutsAndNoGradientAgreeToo) {
  torch::manual_seed(4);
  const at::Tensor x = awkward({2, 3, 6, 8}, torch::kFloat, true);
  const at::Tensor want = torch::max_pool2d(x, 2);
  expect_same(models::max_pool2x2(x.contiguous(at::MemoryFormat::ChannelsLast)).contiguous(), want, "channels last");
  expect_same(models::max_pool2x2(x.transpose(2, 3)).transpose(2, 3).contiguous(),
              torch::max_pool2d(x.transpose(2, 3).contiguous(), 2).transpose(2, 3).contiguous(), "a transposed view");
  torch::NoGradGuard no_grad;
  expect_same(models::max_pool2x2(x), want, "no gradient");
}

// ConvBlock (conv, ReLU, this pool) equals libtorch's conv, relu, max_pool2d bit for bit, values
// and every gradient, on an input with blank regions (ties at the bias' ReLU) and negative ones.
TEST(MaxPool2x2, TheConvBlockIsLibtorchsBitForBit) {
  torch::manual_seed(5);
  for (auto dtype : {torch::kDouble, torch::kFloat}) {
    models::ConvBlock block(2, 3, /*pool=*/true, /*batch_norm=*/false);
    block->to(dtype);
    at::Tensor x = torch::randn({4, 2, 8, 8}, dtype);
    x.slice(2, 0, 4).zero_();  // blank rows: every window there ties
    x.slice(3, 4, 8).fill_(-1.0);
    const at::Tensor xa = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
    const at::Tensor g = gradient_like(torch::zeros({4, 3, 4, 4}, dtype));
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
