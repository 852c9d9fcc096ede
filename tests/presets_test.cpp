// The presets (mlp, cnn, gpt, unet) are spelled as layer lists (models/layer_table.h), yet build
// the models their own modules built: the same layer names, parameter and buffer names, shapes
// and initial values, and the same training-mode output (dropout masks included). The reference
// here is each preset as its modules (models/layers.h) composed it.
#include <gtest/gtest.h>

#include <cmath>

#include <torch/torch.h>

#include "common/rng.h"
#include "models/layers.h"
#include "models/max_pool.h"
#include "models/model.h"
#include "models/skip.h"

using namespace pipetrain;
using nlohmann::json;

namespace {

models::Model build(json cfg, uint64_t seed) {
  JsonReader r(cfg, "model", "test.json");
  return models::build(r, seed);
}

void expect_same(const torch::nn::Sequential& preset, const torch::nn::Sequential& reference, const at::Tensor& x,
                 const std::string& what) {
  EXPECT_EQ(models::layer_names(preset), models::layer_names(reference)) << what;
  for (bool buffers : {false, true}) {
    const auto a = buffers ? preset->named_buffers() : preset->named_parameters();
    const auto b = buffers ? reference->named_buffers() : reference->named_parameters();
    ASSERT_EQ(a.keys(), b.keys()) << what;
    for (const auto& p : b) {
      ASSERT_EQ(a[p.key()].sizes(), p.value().sizes()) << what << ": " << p.key();
      EXPECT_TRUE(torch::equal(a[p.key()], p.value())) << what << ": " << p.key();
    }
  }
  RngContextGuard rng(RngContext{5, 2, 0});
  EXPECT_TRUE(torch::equal(models::forward_with_skips(preset, x), models::forward_with_skips(reference, x))) << what;
}

// The unet's modules as unet.cpp composed them before it was spelled as a list.
class DownImpl : public torch::nn::Cloneable<DownImpl>, public models::SkipDeclaring {
 public:
  DownImpl(int64_t in, int64_t out, bool pool, std::string stash, double p = 0.0)
      : in_(in), out_(out), pool_(pool), stash_(std::move(stash)), p_(p) { reset(); }
  void reset() override {
    conv_ = register_module("conv", models::ConvBlock(in_, out_, false));
    dropout_ = register_module("dropout", models::Dropout(p_, 0));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = dropout_(conv_(pool_ ? models::max_pool2x2(x) : x));
    if (!stash_.empty()) models::stash(stash_, h);
    return h;
  }
  std::vector<std::string> stashes() const override { return stash_.empty() ? std::vector<std::string>{} : std::vector<std::string>{stash_}; }

 private:
  int64_t in_, out_;
  bool pool_;
  std::string stash_;
  double p_;
  models::ConvBlock conv_{nullptr};
  models::Dropout dropout_{nullptr};
};
TORCH_MODULE(Down);

class UpImpl : public torch::nn::Cloneable<UpImpl>, public models::SkipDeclaring {
 public:
  UpImpl(int64_t in, int64_t out, std::string pop) : in_(in), out_(out), pop_(std::move(pop)) { reset(); }
  void reset() override {
    up_ = register_module("up", models::ConvBlock(in_, out_, false));
    merge_ = register_module("merge", models::ConvBlock(2 * out_, out_, false));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = up_(torch::upsample_nearest2d(x, {x.size(2) * 2, x.size(3) * 2}));
    return merge_(torch::cat({h, models::pop(pop_)}, 1));
  }
  std::vector<std::string> pops() const override { return {pop_}; }

 private:
  int64_t in_, out_;
  std::string pop_;
  models::ConvBlock up_{nullptr}, merge_{nullptr};
};
TORCH_MODULE(Up);

class PixelHeadImpl : public torch::nn::Cloneable<PixelHeadImpl> {
 public:
  PixelHeadImpl(int64_t in, int64_t classes) : in_(in), classes_(classes) { reset(); }
  void reset() override { conv_ = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_, classes_, 1))); }
  at::Tensor forward(const at::Tensor& x) { return conv_(x).permute({0, 2, 3, 1}); }

 private:
  int64_t in_, classes_;
  torch::nn::Conv2d conv_{nullptr};
};
TORCH_MODULE(PixelHead);

TEST(Presets, MlpIsItsDenseLayers) {
  for (double p : {0.0, 0.3}) {
    const models::Model m = build({{"family", "mlp"}, {"in", 12}, {"width", 16}, {"layers", 3}, {"out", 5}, {"dropout", p}}, 7);
    torch::manual_seed(7);
    torch::nn::Sequential ref;
    for (int i = 0; i < 3; ++i) ref->push_back("fc" + std::to_string(i + 1), models::Dense(i == 0 ? 12 : 16, 16, true, p, i));
    ref->push_back("head", models::Dense(16, 5, false));
    expect_same(m.layers, ref, torch::randn({6, 12}), "mlp");
    EXPECT_EQ(m.sample_shape, (std::vector<int64_t>{12}));
    EXPECT_EQ(m.classes, 5);
  }
}

TEST(Presets, CnnIsItsConvBlocks) {
  for (bool bn : {false, true}) {
    const models::Model m = build({{"family", "cnn"}, {"image_size", 16}, {"channels", 4}, {"hidden", 10}, {"classes", 3}, {"batch_norm", bn}}, 7);
    torch::manual_seed(7);
    torch::nn::Sequential ref;
    ref->push_back("conv1", models::ConvBlock(1, 4, true, bn));
    ref->push_back("conv2", models::ConvBlock(4, 8, true, bn));
    ref->push_back("conv3", models::ConvBlock(8, 8, false, bn));
    ref->push_back("fc", models::Dense(8 * 4 * 4, 10, true, 0.25, 0));
    ref->push_back("head", models::Dense(10, 3, false));
    expect_same(m.layers, ref, torch::randn({4, 1, 16, 16}), bn ? "cnn, batch norm" : "cnn");
  }
}

TEST(Presets, GptIsItsEmbeddingBlocksNormAndTiedHead) {
  const models::Model m = build({{"family", "gpt"}, {"vocab_size", 32}, {"seq_len", 8}, {"d_model", 16}, {"n_heads", 2}, {"n_layers", 3},
                                 {"d_ff", 24}, {"dropout", 0.1}, {"tie_embeddings", true}}, 7);
  torch::manual_seed(7);
  torch::nn::Sequential ref;
  ref->push_back("embed", models::Embedding(32, 8, 16, 0.1, 0));
  for (int i = 0; i < 3; ++i) ref->push_back("block" + std::to_string(i), models::Block(16, 2, 24, 0.1, 1 + 3 * i));
  ref->push_back("norm", models::Norm(16));
  ref->push_back("head", models::Dense(16, 32, false, 0.0, 0, false));
  {
    torch::NoGradGuard no_grad;
    ref->named_parameters()["embed.tok.weight"].mul_(0.02);  // GPT-2's scale for a tied weight
    ref->named_parameters()["head.linear.weight"].copy_(ref->named_parameters()["embed.tok.weight"]);
  }
  expect_same(m.layers, ref, torch::randint(0, 32, {3, 8}), "gpt");
  ASSERT_EQ(m.ties.size(), 1u);
  EXPECT_EQ(m.ties[0][0].layer, 0);
  EXPECT_EQ(m.ties[0][0].name, "tok.weight");
  EXPECT_EQ(m.ties[0][1].layer, 5);
  EXPECT_EQ(m.ties[0][1].name, "linear.weight");
  EXPECT_TRUE(m.token_input);
}

// A tied head starts at the scale of GPT-2's weights, not the embedding's unit normal (whose
// logits, of standard deviation sqrt(d_model), gave a first loss of several times ln(vocab)):
// the first loss is that of a near-uniform prediction.
TEST(Presets, ATiedGptStartsNearTheUniformLoss) {
  const int64_t vocab = 1000;
  for (const bool tie : {true, false}) {
    models::Model m = build({{"family", "gpt"}, {"vocab_size", vocab}, {"seq_len", 16}, {"d_model", 128}, {"n_heads", 4},
                                   {"n_layers", 2}, {"dropout", 0.0}, {"tie_embeddings", tie}}, 3);
    torch::NoGradGuard no_grad;
    const at::Tensor x = torch::randint(0, vocab, {8, 16}), y = torch::randint(0, vocab, {8, 16});
    const at::Tensor logits = m.layers->forward(x);
    const double loss = torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}), y.reshape({-1})).item<double>();
    EXPECT_NEAR(loss, std::log(double(vocab)), 0.5) << (tie ? "tied" : "untied");
  }
}

TEST(Presets, UnetIsItsDownAndUpBlocks) {
  const models::Model m = build({{"family", "unet"}, {"image_size", 8}, {"channels", 2}, {"classes", 3}, {"dropout", 0.2}}, 7);
  torch::manual_seed(7);
  torch::nn::Sequential ref;
  ref->push_back("enc1", Down(1, 2, false, "enc1"));
  ref->push_back("enc2", Down(2, 4, true, "enc2"));
  ref->push_back("mid", Down(4, 8, true, "", 0.2));
  ref->push_back("dec2", Up(8, 4, "enc2"));
  ref->push_back("dec1", Up(4, 2, "enc1"));
  ref->push_back("head", PixelHead(2, 3));
  expect_same(m.layers, ref, torch::randn({2, 1, 8, 8}), "unet");
  EXPECT_TRUE(m.pixel_targets);
  EXPECT_EQ(m.classes, 3);
  const auto skips = models::skips_of(m.layers);
  ASSERT_EQ(skips.size(), 2u);
  EXPECT_EQ(skips[0].pop_layer + skips[1].pop_layer, 3 + 4);
}

// In-process copies clone the model (pipeline/copies.cpp): a layer whose module's parameters are
// the layer's own (the gpt's embed and blocks) clones into equal, separate tensors.
TEST(Presets, ClonesAreEqualAndSeparate) {
  models::Model m = build({{"family", "gpt"}, {"vocab_size", 16}, {"seq_len", 4}, {"d_model", 8}, {"n_heads", 2}, {"n_layers", 1}}, 3);
  auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(m.layers->clone());
  ASSERT_TRUE(copy);
  const auto a = m.layers->parameters(), b = copy->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
    EXPECT_NE(a[i].data_ptr(), b[i].data_ptr()) << i;
  }
  const at::Tensor x = torch::randint(0, 16, {2, 4});
  m.layers->eval();
  copy->eval();
  EXPECT_TRUE(torch::equal(models::forward_with_skips(m.layers, x), models::forward_with_skips(torch::nn::Sequential(copy), x)));
  {
    torch::NoGradGuard no_grad;
    copy->parameters()[2].add_(1.0);  // the first block's first LayerNorm weight
  }
  EXPECT_FALSE(torch::equal(models::forward_with_skips(m.layers, x), models::forward_with_skips(torch::nn::Sequential(copy), x)));
}

}  // namespace
