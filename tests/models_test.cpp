#include <gtest/gtest.h>

#include <torch/torch.h>

#include "common/error.h"
#include "common/rng.h"
#include "models/layers.h"
#include "models/model.h"
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
