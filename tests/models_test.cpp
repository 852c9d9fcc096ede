#include <gtest/gtest.h>

#include <torch/torch.h>

#include "common/error.h"
#include "common/rng.h"
#include "models/layers.h"
#include "models/model.h"
#include "models/weight_grads.h"
#include "tests/helpers.h"

using namespace pipetrain;
using nlohmann::json;

namespace {
models::Model build(json cfg, uint64_t seed = 0) {
  JsonReader r(cfg, "model", "test.json");
  return models::build(r, seed);
}
}  // namespace

TEST(Models, RegistryListsBuiltInFamilies) {
  auto f = models::families();
  for (const char* name : {"mlp", "cnn", "gpt"}) EXPECT_NE(std::find(f.begin(), f.end(), name), f.end());
}

TEST(Models, ReadableLayerNames) {
  EXPECT_EQ(models::layer_names(build({{"family", "mlp"}, {"layers", 3}}).layers),
            (std::vector<std::string>{"fc1", "fc2", "fc3", "head"}));
  EXPECT_EQ(models::layer_names(build({{"family", "cnn"}}).layers),
            (std::vector<std::string>{"conv1", "conv2", "conv3", "fc", "head"}));
  EXPECT_EQ(models::layer_names(build({{"family", "gpt"}, {"n_layers", 2}}).layers),
            (std::vector<std::string>{"embed", "block0", "block1", "norm", "head"}));
}

TEST(Models, ShapesOfEachFamily) {
  auto mlp = build({{"family", "mlp"}, {"in", 12}, {"width", 8}, {"out", 3}});
  EXPECT_EQ(mlp.layers->forward(torch::randn({5, 12})).sizes(), (std::vector<int64_t>{5, 3}));
  auto cnn = build({{"family", "cnn"}, {"channels", 4}, {"hidden", 16}});
  EXPECT_EQ(cnn.layers->forward(torch::randn({2, 1, 28, 28})).sizes(), (std::vector<int64_t>{2, 10}));
  auto gpt = build({{"family", "gpt"}, {"vocab_size", 17}, {"seq_len", 6}, {"d_model", 8}, {"n_heads", 2}});
  EXPECT_TRUE(gpt.token_input);
  EXPECT_EQ(gpt.layers->forward(torch::randint(0, 17, {3, 6}, torch::kLong)).sizes(),
            (std::vector<int64_t>{3, 6, 17}));
}

TEST(Models, SameSeedSameWeightsOtherSeedOther) {
  json cfg{{"family", "gpt"}, {"vocab_size", 17}, {"seq_len", 6}, {"d_model", 8}, {"n_heads", 2}};
  EXPECT_TRUE(test::same_parameters(*build(cfg, 3).layers, *build(cfg, 3).layers));
  EXPECT_FALSE(test::same_parameters(*build(cfg, 3).layers, *build(cfg, 4).layers));
}

TEST(Models, ConfigErrors) {
  EXPECT_THROW(build({{"family", "rnn"}}), ConfigError);
  EXPECT_THROW(build(json::object()), ConfigError);
  EXPECT_THROW(build({{"family", "gpt"}, {"d_model", 10}, {"n_heads", 4}}), ConfigError);
  try {
    build({{"family", "gpt"}, {"n_layer", 2}});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'model.n_layers'"), std::string::npos) << e.what();
  }
}

// The mask a GPU draws with tensor operations is the CPU loop's, bit for bit, and keeps about
// 1 - p of the elements, independently per sample.
TEST(Dropout, TheDevicesMaskIsTheHostsAndKeepsTheRightShare) {
  std::vector<uint64_t> keys;
  for (int i = 0; i < 5; ++i) keys.push_back(rng_key(3, 1, 2, i));
  keys.push_back(0);
  keys.push_back(~uint64_t{0});
  for (double keep : {0.1, 0.5, 0.9}) {
    const auto opts = at::TensorOptions().dtype(at::kDouble);
    const at::Tensor loop = models::keyed_keep_mask(keys, {3, 40, 41}, keep, opts);
    const at::Tensor ops = models::keyed_keep_mask(keys, {3, 40, 41}, keep, opts, /*tensor_ops=*/true);
    ASSERT_EQ(loop.sizes(), ops.sizes());
    EXPECT_TRUE(torch::equal(loop, ops)) << "keep " << keep;
    const int64_t n = 3 * 40 * 41;
    for (int64_t i = 0; i < loop.size(0); ++i) {
      // Binomial(n, keep): 5 standard deviations either side.
      const double kept = loop[i].sum().item<double>(), sd = std::sqrt(n * keep * (1 - keep));
      EXPECT_NEAR(kept, n * keep, 5 * sd) << "sample " << i << " keep " << keep;
      if (i > 0) EXPECT_FALSE(torch::equal(loop[i], loop[i - 1]));
    }
  }
  EXPECT_TRUE(torch::equal(models::keyed_keep_mask(keys, {7}, 1.0, {}), torch::ones({7, 7})));
  EXPECT_EQ(models::keyed_keep_mask(keys, {7}, 0.0, {}).sum().item<double>(), 0);
  EXPECT_EQ(models::keyed_keep_mask({}, {4}, 0.5, {}).numel(), 0);
}

TEST(Dropout, MaskDoesNotDependOnMicroBatching) {
  models::Dropout drop(0.5, 7);
  auto x = torch::ones({6, 10});
  at::Tensor whole, parts;
  {
    RngContextGuard g(RngContext{11, 2, 0});
    whole = drop(x);
  }
  {
    RngContextGuard g(RngContext{11, 2, 0});
    auto a = drop(x.narrow(0, 0, 4));
    RngContextGuard h(RngContext{11, 2, 4});
    parts = torch::cat({a, drop(x.narrow(0, 4, 2))});
  }
  EXPECT_TRUE(torch::equal(whole, parts));
  EXPECT_GT(whole.eq(0).sum().item<int>(), 0);
  {
    RngContextGuard g(RngContext{11, 3, 0});  // another step draws another mask
    EXPECT_FALSE(torch::equal(whole, drop(x)));
  }
  drop->eval();
  EXPECT_TRUE(torch::equal(drop(x), x));
}

// models::linear adds every later micro-batch's weight gradient into .grad inside its GEMM:
// autograd is handed a weight gradient only for the first (as AccumulateGrad keeps it as .grad),
// so a hook on the weight sees one gradient for three backward passes (libtorch's linear: three),
// .grad keeps its storage, and its value is the sum of the three computed apart. A backward that
// asks only for the input's gradient (zero-bubble's B) leaves .grad alone.
TEST(Linear, LaterMicroBatchesWeightGradientsAreAddedInsideTheGemm) {
  torch::manual_seed(3);
  const auto f64 = torch::kFloat64;
  auto weight = torch::randn({5, 4}, f64).requires_grad_();
  auto bias = torch::randn({5}, f64).requires_grad_();
  std::vector<torch::Tensor> xs, gys;
  for (int m = 0; m < 3; ++m) {
    xs.push_back(torch::randn({2, 3, 4}, f64));  // a leading batch of batches, as a GPT's tokens
    gys.push_back(torch::randn({2, 3, 5}, f64));
  }
  int handed = 0;
  weight.register_hook([&](const torch::Tensor& g) { handed += g.defined(); });
  const void* storage = nullptr;
  for (int m = 0; m < 3; ++m) {
    models::linear(xs[m], weight, bias).backward(gys[m]);
    if (m == 0) storage = weight.grad().data_ptr();
  }
  EXPECT_EQ(handed, 1);
  EXPECT_EQ(weight.grad().data_ptr(), storage);
  auto expected = torch::zeros({5, 4}, f64), expected_bias = torch::zeros({5}, f64);
  for (int m = 0; m < 3; ++m) {
    expected += gys[m].reshape({-1, 5}).t().mm(xs[m].reshape({-1, 4}));
    expected_bias += gys[m].reshape({-1, 5}).sum(0);
  }
  EXPECT_TRUE(torch::allclose(weight.grad(), expected, 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(bias.grad(), expected_bias, 1e-12, 1e-12));

  // Only the input's gradient: the weight's stays as it was.
  const auto before = weight.grad().clone();
  auto x = torch::randn({2, 4}, f64).requires_grad_();
  auto y = models::linear(x, weight, bias);
  const auto gx = torch::autograd::grad({y}, {x}, {torch::ones({2, 5}, f64)})[0];
  EXPECT_TRUE(torch::equal(weight.grad(), before));
  EXPECT_TRUE(torch::allclose(gx, torch::ones({2, 5}, f64).mm(weight.detach()), 1e-12, 1e-12));
  EXPECT_EQ(handed, 1);
}

// With a stash in place (models/weight_grads.h), models::linear's backward keeps each
// micro-batch's output gradient and input instead of adding the weight's gradient: .grad stays
// as it was (the bias's and the input's gradients are computed at once); flush() then computes
// the weight's gradient as one GEMM over every micro-batch's rows and adds it into .grad (an
// earlier batch's, when accumulating), in float64 equal to the sum of the micro-batches'
// gradients. Outside the guard, backward computes its own again.
TEST(Linear, AStashDefersTheWeightGradientToOneGemm) {
  torch::manual_seed(4);
  const auto f64 = torch::kFloat64;
  auto weight = torch::randn({5, 4}, f64).requires_grad_();
  auto bias = torch::randn({5}, f64).requires_grad_();
  const auto earlier = torch::randn({5, 4}, f64);
  weight.mutable_grad() = earlier.clone();  // an earlier batch's, accumulating
  std::vector<torch::Tensor> xs, gys;
  for (int m = 0; m < 3; ++m) {
    xs.push_back(torch::randn({2, 3, 4}, f64));
    gys.push_back(torch::randn({2, 3, 5}, f64));
  }
  models::WeightGradStash stash;
  {
    models::DeferWeightGrads defer(&stash);
    EXPECT_EQ(models::current_weight_grad_stash(), &stash);
    for (int m = 0; m < 3; ++m) {
      auto x = xs[m].clone().requires_grad_();
      models::linear(x, weight, bias).backward(gys[m]);
      EXPECT_TRUE(torch::allclose(x.grad(), gys[m].matmul(weight.detach()), 1e-12, 1e-12));
    }
  }
  EXPECT_EQ(models::current_weight_grad_stash(), nullptr);
  EXPECT_TRUE(torch::equal(weight.grad(), earlier));  // nothing added yet
  EXPECT_EQ(stash.bytes(), 3 * (2 * 3 * 5 + 2 * 3 * 4) * 8);
  auto expected = earlier.clone(), expected_bias = torch::zeros({5}, f64);
  for (int m = 0; m < 3; ++m) {
    expected += gys[m].reshape({-1, 5}).t().mm(xs[m].reshape({-1, 4}));
    expected_bias += gys[m].reshape({-1, 5}).sum(0);
  }
  EXPECT_TRUE(torch::allclose(bias.grad(), expected_bias, 1e-12, 1e-12));
  stash.flush();
  EXPECT_TRUE(stash.empty());
  EXPECT_TRUE(torch::allclose(weight.grad(), expected, 1e-12, 1e-12));

  // No gradient yet: the flush sets it; no guard: backward adds its own as before.
  weight.mutable_grad() = torch::Tensor();
  {
    models::DeferWeightGrads defer(&stash);
    models::linear(xs[0], weight, bias).backward(gys[0]);
  }
  EXPECT_FALSE(weight.grad().defined());
  stash.flush();
  const auto one = gys[0].reshape({-1, 5}).t().mm(xs[0].reshape({-1, 4}));
  EXPECT_TRUE(torch::allclose(weight.grad(), one, 1e-12, 1e-12));
  models::linear(xs[1], weight, bias).backward(gys[1]);
  EXPECT_TRUE(torch::allclose(weight.grad(), one + gys[1].reshape({-1, 5}).t().mm(xs[1].reshape({-1, 4})), 1e-12, 1e-12));
  EXPECT_TRUE(stash.empty());
}

// The transformer block's attention is fused (at::scaled_dot_product_attention); it equals the
// explicit product, mask and softmax within each precision's tolerance, causal or not, and its
// gradients too.
TEST(FusedAttention, EqualsTheExplicitPathInEachPrecision) {
  for (const bool causal : {true, false})
    for (const auto type : {torch::kDouble, torch::kFloat, torch::kBFloat16}) {
      torch::manual_seed(7);
      models::Block block(32, 4, 64, /*dropout=*/0.0, 0, causal);
      block->to(type);
      const at::Tensor x = torch::randn({3, 10, 32}).to(type).requires_grad_();
      const at::Tensor y = block->forward(x);
      auto p = block->named_parameters();
      // The same block, its attention written out.
      auto ln = [&](const at::Tensor& h, const std::string& n) {
        return torch::layer_norm(h, {32}, p[n + ".weight"], p[n + ".bias"]);
      };
      const at::Tensor x2 = x.detach().clone().requires_grad_();
      auto qkv = torch::linear(ln(x2, "ln1"), p["qkv.weight"], p["qkv.bias"]).view({3, 10, 3, 4, 8}).permute({2, 0, 3, 1, 4});
      auto att = torch::matmul(qkv[0], qkv[1].transpose(-2, -1)) * (1.0 / std::sqrt(8.0));
      if (causal) att = att.masked_fill(torch::ones({10, 10}, torch::kBool).triu(1), -INFINITY);
      auto a = torch::matmul(torch::softmax(att, -1), qkv[2]).transpose(1, 2).reshape({3, 10, 32});
      auto h = x2 + torch::linear(a, p["proj.weight"], p["proj.bias"]);
      const at::Tensor ref = h + torch::linear(torch::gelu(torch::linear(ln(h, "ln2"), p["fc1.weight"], p["fc1.bias"])),
                                               p["fc2.weight"], p["fc2.bias"]);
      const double tol = type == torch::kDouble ? 1e-12 : type == torch::kFloat ? 1e-5 : 5e-2;
      EXPECT_LE((y.to(torch::kDouble) - ref.to(torch::kDouble)).abs().max().item<double>(), tol)
          << "causal " << causal << " " << type;
      y.sum().backward();
      const at::Tensor gx = x.grad().clone();
      ref.sum().backward();
      EXPECT_LE((gx.to(torch::kDouble) - x2.grad().to(torch::kDouble)).abs().max().item<double>(), tol * 4)
          << "input gradient, causal " << causal << " " << type;
    }
}
