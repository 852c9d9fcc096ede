// StarCoder2 in the hf family without transformers: its config read as Mistral's layers with
// LayerNorms (a weight and a bias), an MLP without a gate through the tanh GELU, biases by
// use_bias and its dropouts, under its names (mlp.c_fc, mlp.c_proj); what it refuses, in one line
// naming the field.
// Against transformers: hf_test.cpp (HfParity.Starcoder2*).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "models/hf.h"
#include "models/model.h"
#include "models/safetensors.h"
#include "tests/hf_oracle.h"

using namespace pipetrain;

namespace {

std::string root() { return test::scratch_dir("hf_starcoder"); }

const nlohmann::json kStarcoder2{{"architectures", {"Starcoder2ForCausalLM"}}, {"model_type", "starcoder2"}, {"vocab_size", 40},
                                 {"hidden_size", 16}, {"intermediate_size", 24}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                                 {"num_key_value_heads", 2}, {"norm_epsilon", 1e-4}, {"sliding_window", 4}};

bool has(const models::HfSpec& spec, const std::string& ours, const std::string& theirs) {
  return std::any_of(spec.tensors.begin(), spec.tensors.end(), [&](const models::HfTensor& t) { return t.ours == ours && t.theirs == theirs; });
}

}  // namespace

TEST(HfFamily, Starcoder2ResolvesItsLayerNormsGeluMlpAndBiases) {
  const std::string dir = test::hf_write_model(root() + "/starcoder2", kStarcoder2);
  const models::HfSpec spec = models::read_hf_spec(dir, 8, "test");
  const nlohmann::json& b = spec.layers["layers"][1];
  EXPECT_EQ(b["norm_center"], true);
  EXPECT_EQ(b["norm_bias"], true);
  EXPECT_EQ(b["eps"], 1e-4);
  EXPECT_EQ(b["act"], "gelu_tanh");
  EXPECT_EQ(b["mlp_gate"], false);
  EXPECT_EQ(b["qkv_bias"], true);
  EXPECT_EQ(b["o_bias"], true);
  EXPECT_EQ(b["mlp_bias"], true);
  EXPECT_EQ(b["sliding_window"], 4);
  EXPECT_EQ(spec.layers["layers"][3]["bias"], true);  // the last norm
  EXPECT_TRUE(spec.tied);
  EXPECT_TRUE(has(spec, "layer_1.llama.mlp.up_proj.weight", "model.layers.1.mlp.c_fc.weight"));
  EXPECT_TRUE(has(spec, "layer_1.llama.mlp.down_proj.bias", "model.layers.1.mlp.c_proj.bias"));
  EXPECT_TRUE(has(spec, "layer_0.llama.input_layernorm.bias", "model.layers.0.input_layernorm.bias"));
  EXPECT_TRUE(has(spec, "layer_0.llama.self_attn.o_proj.bias", "model.layers.0.self_attn.o_proj.bias"));
  EXPECT_TRUE(has(spec, "norm.rms.bias", "model.norm.bias"));
  EXPECT_FALSE(std::any_of(spec.tensors.begin(), spec.tensors.end(),
                           [](const models::HfTensor& t) { return t.ours.find("gate_proj") != std::string::npos; }));
  // Its weights read into the model, each where its name says.
  models::Model m = test::hf_build(dir, 8);
  models::SafetensorsCheckpoint ck(dir);
  auto params = m.layers->named_parameters();
  for (const models::HfTensor& t : spec.tensors) {
    if (t.theirs == "lm_head.weight") continue;  // tied: the embedding's
    ASSERT_TRUE(params.contains(t.ours)) << t.ours;
    EXPECT_TRUE(torch::equal(params[t.ours], ck.get(t.theirs))) << t.ours;
  }
  // Without biases: none read.
  const models::HfSpec plain = models::read_hf_spec(test::hf_write_model(root() + "/plain", test::with(kStarcoder2, {{"use_bias", false}})), 8, "test");
  EXPECT_EQ(plain.layers["layers"][1]["qkv_bias"], false);
  EXPECT_FALSE(has(plain, "layer_1.llama.mlp.up_proj.bias", "model.layers.1.mlp.c_fc.bias"));
  EXPECT_TRUE(has(plain, "layer_0.llama.input_layernorm.bias", "model.layers.0.input_layernorm.bias"));  // a LayerNorm's all the same
  // Its dropouts as published: the blocks' (keyed masks, training alone), the embeddings' a layer.
  std::ofstream(dir + "/config.json") << test::with(kStarcoder2, {{"residual_dropout", 0.1}, {"attention_dropout", 0.05}, {"embedding_dropout", 0.2}}).dump();
  const nlohmann::json dropping = models::read_hf_spec(dir, 8, "test").layers["layers"];
  EXPECT_EQ(dropping[1]["type"], "dropout");
  EXPECT_EQ(dropping[1]["p"], 0.2);
  EXPECT_EQ(dropping[2]["dropout"], 0.1);
  EXPECT_EQ(dropping[2]["attn_dropout"], 0.05);
  models::Model trained = test::hf_build(dir, 8);  // builds, the same weights read
  EXPECT_TRUE(torch::equal(trained.layers->named_parameters()["layer_1.llama.mlp.up_proj.weight"], ck.get("model.layers.1.mlp.c_fc.weight")));
  // Refused by name: a dropout out of range, another activation.
  std::ofstream(dir + "/config.json") << test::with(kStarcoder2, {{"residual_dropout", 1.5}}).dump();
  EXPECT_NE(test::hf_error(dir).find("residual_dropout must be in [0, 0.99], got 1.5"), std::string::npos) << test::hf_error(dir);
  std::ofstream(dir + "/config.json") << test::with(kStarcoder2, {{"hidden_act", "gelu"}}).dump();
  EXPECT_NE(test::hf_error(dir).find("hidden_act 'gelu' is not supported (gelu_pytorch_tanh)"), std::string::npos) << test::hf_error(dir);
}

// Seed-OSS: Llama's layers with biases on q, k and v (attention_bias, true by default) and on o
// (attention_out_bias), heads of 128, 8 key heads and padding token 1 by default, its dropouts
// (0.1 by default) the blocks'. Against transformers: HfParity.SeedOss*.
TEST(HfFamily, SeedOssResolvesItsBiasesDefaultsAndDropouts) {
  const nlohmann::json seed{{"architectures", {"SeedOssForCausalLM"}}, {"model_type", "seed_oss"}, {"vocab_size", 40}, {"hidden_size", 16},
                            {"intermediate_size", 24}, {"num_hidden_layers", 2}, {"num_attention_heads", 16}};
  const std::string dir = test::hf_write_model(root() + "/seed", seed);
  const models::HfSpec spec = models::read_hf_spec(dir, 8, "test");
  const nlohmann::json& b = spec.layers["layers"][1];
  EXPECT_EQ(b["head_dim"], 128);
  EXPECT_EQ(b["n_kv_heads"], 8);
  EXPECT_EQ(b["qkv_bias"], true);
  EXPECT_EQ(b["o_bias"], false);
  EXPECT_EQ(b["dropout"], 0.1);
  EXPECT_EQ(b["attn_dropout"], 0.1);
  EXPECT_EQ(spec.layers["layers"][0]["padding_idx"], 1);
  EXPECT_TRUE(has(spec, "layer_0.llama.self_attn.k_proj.bias", "model.layers.0.self_attn.k_proj.bias"));
  EXPECT_FALSE(has(spec, "layer_0.llama.self_attn.o_proj.bias", "model.layers.0.self_attn.o_proj.bias"));
  test::hf_build(dir, 8);  // its weights read
  const models::HfSpec out = models::read_hf_spec(
      test::hf_write_model(root() + "/seed-out", test::with(seed, {{"attention_out_bias", true}, {"residual_dropout", 0.0}, {"attention_dropout", 0.0}})), 8,
      "test");
  EXPECT_TRUE(has(out, "layer_1.llama.self_attn.o_proj.bias", "model.layers.1.self_attn.o_proj.bias"));
  EXPECT_FALSE(out.layers["layers"][1].contains("dropout"));
}
