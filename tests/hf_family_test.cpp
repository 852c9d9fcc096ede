// The hf family without transformers: a directory written here in save_pretrained's form (config.json
// by hand, random weights named as transformers names them), what the family reads from it and
// builds, and what it refuses in it, each in one line naming the field or the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/error.h"
#include "models/families.h"
#include "models/hf.h"
#include "models/model.h"
#include "tests/hf_oracle.h"
#include "tests/process_helpers.h"

using namespace pipetrain;

namespace {

std::string root() { return test::scratch_dir("hf_family"); }

models::Model build(const std::string& dir, int64_t seq_len) { return test::hf_build(dir, seq_len); }


const nlohmann::json kLlamaConfig{{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", 40},
                                  {"hidden_size", 16}, {"intermediate_size", 24}, {"num_hidden_layers", 2},
                                  {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"rms_norm_eps", 1e-6},
                                  {"rope_theta", 10000.0}, {"hidden_act", "silu"}, {"tie_word_embeddings", false}};

// `config` and its weights (random, named as transformers names them) into a fresh directory.
std::string write_model(const std::string& name, const nlohmann::json& config, int64_t seq_len = 8) {
  return test::hf_write_model(root() + "/" + name, config, seq_len);
}

using test::hf_error;

using test::with;

}  // namespace

TEST(HfFamily, AValidDirectoryBuildsWithItsWeights) {
  const std::string dir = write_model("valid", kLlamaConfig);
  models::Model m = build(dir, 8);
  models::SafetensorsCheckpoint ck(dir);
  EXPECT_TRUE(torch::equal(m.layers->named_parameters()["layer_1.llama.self_attn.k_proj.weight"],
                           ck.get("model.layers.1.self_attn.k_proj.weight")));
  EXPECT_EQ(m.classes, 40);
  EXPECT_EQ(m.sample_shape, (std::vector<int64_t>{8}));
  EXPECT_NE(hf_error(dir, 8, {{"experts_kernel", "grouped"}}).find("experts_kernel: needs a mixture of experts (LlamaForCausalLM has none)"),
            std::string::npos);  // the experts' kernel of a model without experts
}

TEST(HfFamily, WhatWouldComputeADifferentModelIsRefusedByName) {
  const auto refused = [](const std::string& name, const nlohmann::json& changes, const std::string& expected) {
    const std::string dir = write_model(name, kLlamaConfig);
    std::ofstream(dir + "/config.json") << with(kLlamaConfig, changes).dump(2);
    const std::string error = hf_error(dir);
    EXPECT_NE(error.find(expected), std::string::npos) << name << ": " << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  };
  refused("dynamic", {{"max_position_embeddings", 4}, {"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 0.5}}}},
          "rope_scaling.factor must be at least 1, got 0.5");
  refused("rope-kind", {{"rope_scaling", {{"rope_type", "ntk"}, {"factor", 4.0}}}}, "rope type 'ntk' is not supported (default, linear");
  refused("longrope", {{"rope_scaling", {{"rope_type", "longrope"}, {"short_factor", {1.0, 1.0}}}}}, "rope_scaling.long_factor is required by longrope");
  refused("gelu", {{"hidden_act", "gelu"}}, "hidden_act 'gelu' is not supported");
  refused("dropout", {{"attention_dropout", 0.1}}, "attention_dropout above 0 is not supported");
  refused("resid", {{"resid_pdrop", 0.1}}, "resid_pdrop above 0 is not supported");  // Phi-3's
  refused("partial", {{"partial_rotary_factor", 0.5}}, "partial_rotary_factor 0.5 is not supported for LlamaForCausalLM");
  refused("gqa", {{"num_key_value_heads", 3}}, "num_key_value_heads must divide num_attention_heads (4)");
  refused("llama-softcap", {{"final_logit_softcapping", 30.0}}, "final_logit_softcapping 30 is not supported for LlamaForCausalLM");
  const nlohmann::json gemma2{{"architectures", {"Gemma2ForCausalLM"}}, {"head_dim", 4}};
  refused("gemma-act", with(gemma2, {{"hidden_activation", "silu"}}), "hidden_activation 'silu' is not supported (GeGLU's gelu_pytorch_tanh)");
  refused("gemma-bidirectional", with(gemma2, {{"use_bidirectional_attention", true}}), "use_bidirectional_attention true is not supported");
  const nlohmann::json mixtral{{"architectures", {"MixtralForCausalLM"}}, {"num_local_experts", 4}};
  refused("aux-loss", with(mixtral, {{"output_router_logits", true}}), "output_router_logits true is not supported (the router's auxiliary loss");
  refused("jitter", with(mixtral, {{"router_jitter_noise", 0.1}}), "router_jitter_noise above 0 is not supported");
  refused("top-k", with(mixtral, {{"num_experts_per_tok", 5}}), "num_experts_per_tok must be in [1, 4], got 5");
  refused("ministral-beta",
          {{"architectures", {"Ministral3ForCausalLM"}},
           {"rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 4}}}},
          "rope_parameters needs llama_4_scaling_beta and original_max_position_embeddings (Ministral 3's query scale)");
  refused("oss-limit", {{"architectures", {"GptOssForCausalLM"}}, {"swiglu_limit", 0.0}}, "swiglu_alpha and swiglu_limit must be above 0");
  refused("dense-layers", {{"architectures", {"Qwen3MoeForCausalLM"}}, {"mlp_only_layers", {0, 7}}}, "mlp_only_layers holds 7, not a layer in [0, 2)");
  refused("shared-expert", {{"architectures", {"Qwen2MoeForCausalLM"}}, {"num_experts", 4}, {"shared_expert_intermediate_size", 0}},
          "shared_expert_intermediate_size must be in [1, ");
  const std::string bert = root() + "/bert";
  std::filesystem::create_directories(bert);
  std::ofstream(bert + "/config.json") << with(kLlamaConfig, {{"architectures", {"BertForMaskedLM"}}}).dump();
  EXPECT_NE(hf_error(bert).find("architectures 'BertForMaskedLM' is not supported (LlamaForCausalLM, MistralForCausalLM, Ministral3ForCausalLM, "
                                "Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, Olmo2ForCausalLM, Olmo3ForCausalLM, GemmaForCausalLM, "
                                "Gemma2ForCausalLM, Gemma3ForCausalLM, GraniteForCausalLM, GraniteMoeForCausalLM, "
                                "GraniteMoeSharedForCausalLM, GraniteMoeHybridForCausalLM, SmolLM3ForCausalLM, "
                                "MixtralForCausalLM, "
                                "Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, Glm4MoeForCausalLM, GptOssForCausalLM, Llama4ForCausalLM, "
                                "Llama4ForConditionalGeneration, Glm4ForCausalLM, Ernie4_5ForCausalLM, Exaone4ForCausalLM, MiniMaxM2ForCausalLM, "
                                "ArceeForCausalLM, ApertusForCausalLM, HunYuanDenseV1ForCausalLM, Qwen3NextForCausalLM, Qwen3_5ForCausalLM, "
                                "Qwen3_5MoeForCausalLM, Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration, Gemma3ForConditionalGeneration, "
                                "Mistral3ForConditionalGeneration, LlavaForConditionalGeneration, InternVLForConditionalGeneration, "
                                "AyaVisionForConditionalGeneration, Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration, "
                                "Qwen2VLForConditionalGeneration, "
                                "Qwen2_5_VLForConditionalGeneration, NemotronHForCausalLM, "
                                "BambaForCausalLM, CohereForCausalLM, Cohere2ForCausalLM, Starcoder2ForCausalLM, SeedOssForCausalLM, GPT2LMHeadModel, GPTNeoXForCausalLM, PhiForCausalLM, StableLmForCausalLM, FalconForCausalLM, GPTJForCausalLM, GPTBigCodeForCausalLM, OlmoForCausalLM)"),
            std::string::npos)
      << hf_error(bert);
  EXPECT_NE(hf_error(root() + "/nowhere").find("is not a directory"), std::string::npos);
  nlohmann::json untyped = with(kLlamaConfig, {{"model_type", "bert"}});
  untyped.erase("architectures");
  std::ofstream(bert + "/config.json") << untyped.dump();
  EXPECT_NE(hf_error(bert).find("model_type 'bert' is not supported (apertus, arcee, aya_vision, bamba, cohere, cohere2, deepseek_v2, deepseek_v3, ernie4_5, exaone4, falcon, gemma, gemma2, gemma3, gemma3_text, glm4, glm4_moe, gpt2, gpt_bigcode, gpt_neox, gpt_oss, gptj, granite, granitemoe, granitemoehybrid, granitemoeshared, hunyuan_v1_dense, internvl, llama, llama4, llama4_text, llava, minimax_m2, ministral3, mistral, mistral3, "), std::string::npos)
      << hf_error(bert);
  // GPT-2's positions end at n_positions.
  const nlohmann::json gpt2{{"architectures", {"GPT2LMHeadModel"}}, {"vocab_size", 40}, {"n_embd", 16}, {"n_layer", 1},
                            {"n_head", 2}, {"n_positions", 8}};
  EXPECT_EQ(hf_error(write_model("gpt2", gpt2)), "(built)");
  EXPECT_NE(hf_error(root() + "/gpt2", 9).find("n_positions is 8, fewer than model.seq_len (9)"), std::string::npos);
}

TEST(HfFamily, TheWeightsMustBeExactlyTheModels) {
  const std::string dir = write_model("weights", kLlamaConfig);
  models::SafetensorsCheckpoint ck(dir);
  models::NamedTensors all;
  for (const std::string& n : ck.names()) all.emplace_back(n, ck.get(n).clone());
  auto rewrite = [&](const models::NamedTensors& tensors) { models::save_safetensors(dir + "/model.safetensors", tensors); };
  models::NamedTensors missing, extra = all, reshaped = all;
  for (const auto& t : all)
    if (t.first != "model.norm.weight") missing.push_back(t);
  rewrite(missing);
  EXPECT_NE(hf_error(dir).find("has no tensor 'model.norm.weight'"), std::string::npos) << hf_error(dir);
  extra.emplace_back("model.layers.0.self_attn.q_norm.weight", torch::ones({4}));
  rewrite(extra);
  EXPECT_NE(hf_error(dir).find("tensor 'model.layers.0.self_attn.q_norm.weight' is not part of a LlamaForCausalLM"),
            std::string::npos)
      << hf_error(dir);
  for (auto& t : reshaped)
    if (t.first == "lm_head.weight") t.second = torch::zeros({41, 16});
  rewrite(reshaped);
  EXPECT_NE(hf_error(dir).find("tensor 'lm_head.weight' has shape [41, 16], config.json makes it [40, 16]"), std::string::npos)
      << hf_error(dir);
}

// DeepSeek-V3: its latent attention's and router's tensors read by their names (the router's
// correction bias, a buffer, too); its multi-token prediction layer after num_hidden_layers, which
// its published checkpoints hold, is not read; a quantization it does not read and routing it cannot
// compute are refused in one line, and so are DeepSeek-V2's.
TEST(HfFamily, DeepseekV3ReadsItsLatentsSkipsItsPredictionLayer) {
  const nlohmann::json config{{"architectures", {"DeepseekV3ForCausalLM"}}, {"model_type", "deepseek_v3"}, {"vocab_size", 40},
                              {"hidden_size", 16}, {"intermediate_size", 24}, {"moe_intermediate_size", 8},
                              {"num_hidden_layers", 2}, {"num_attention_heads", 2}, {"num_key_value_heads", 2},
                              {"kv_lora_rank", 8}, {"q_lora_rank", nullptr}, {"qk_nope_head_dim", 4}, {"qk_rope_head_dim", 4},
                              {"v_head_dim", 4}, {"head_dim", 4}, {"n_routed_experts", 4}, {"num_experts_per_tok", 2},
                              {"n_group", 2}, {"topk_group", 1}, {"n_shared_experts", 1}, {"first_k_dense_replace", 1},
                              {"tie_word_embeddings", false}};
  const std::string dir = write_model("deepseek", config);
  models::SafetensorsCheckpoint ck(dir);
  for (const char* name : {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                           "model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
                           "model.layers.1.mlp.experts.3.down_proj.weight", "model.layers.1.mlp.shared_experts.up_proj.weight"})
    EXPECT_TRUE(ck.contains(name)) << name;
  models::NamedTensors all;
  for (const std::string& n : ck.names()) all.emplace_back(n, ck.get(n).clone());
  const at::Tensor bias = torch::randn({4});
  for (auto& t : all)
    if (t.first == "model.layers.1.mlp.gate.e_score_correction_bias") t.second = bias;
  all.emplace_back("model.layers.2.eh_proj.weight", torch::zeros({16, 32}));  // the prediction layer
  models::save_safetensors(dir + "/model.safetensors", all);
  models::Model m = build(dir, 8);
  EXPECT_TRUE(torch::equal(m.layers->named_buffers()["layer_1.llama.mlp.gate.e_score_correction_bias"], bias));
  EXPECT_EQ(m.layers->forward(torch::randint(0, 40, {2, 8})).sizes(), (std::vector<int64_t>{2, 8, 40}));
  const at::Tensor tokens = torch::randint(0, 40, {2, 8});  // its experts grouped: the same logits
  models::Model grouped = test::hf_build(dir, 8, {{"experts_kernel", "grouped"}});
  EXPECT_LE((grouped.layers->forward(tokens) - m.layers->forward(tokens)).abs().max().item<double>(), 1e-5);
  all.emplace_back("model.layers.3.eh_proj.weight", torch::zeros({16, 32}));  // one past num_nextn_predict_layers (1)
  models::save_safetensors(dir + "/model.safetensors", all);
  EXPECT_NE(hf_error(dir).find("tensor 'model.layers.3.eh_proj.weight' is not part of a DeepseekV3ForCausalLM"), std::string::npos)
      << hf_error(dir);
  auto refused = [&](const nlohmann::json& changes, const std::string& expected) {
    std::ofstream(dir + "/config.json") << with(config, changes).dump(2);
    const std::string error = hf_error(dir);
    EXPECT_NE(error.find(expected), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  };
  refused({{"n_group", 3}}, "n_group must divide n_routed_experts (4) into groups of at least 2");
  refused({{"topk_group", 1}, {"num_experts_per_tok", 3}}, "topk_group leaves fewer experts than num_experts_per_tok (3)");
  refused({{"qk_rope_head_dim", 3}}, "qk_rope_head_dim must be even");
  refused({{"quantization_config", {{"quant_method", "bitsandbytes"}}}},
          "quantization_config.quant_method 'bitsandbytes' is not supported (fp8, mxfp4 and compressed-tensors are read");
  const nlohmann::json v2{{"architectures", {"DeepseekV2ForCausalLM"}}};
  refused(with(v2, {{"topk_method", "noaux_tc"}}), "topk_method 'noaux_tc' is not supported (greedy, group_limited_greedy)");
  refused(with(v2, {{"mlp_bias", true}}), "mlp_bias true is not supported for DeepseekV2ForCausalLM (its experts would have none)");
}

// Llama 4 as transformers resolves its config: every fourth layer without rotary positions (its
// queries' temperature there), chunks on the others, their q/k norms, experts on every
// interleave_moe_layer_step-th layer in stacked tensors; its vision and language model's config
// and tensors, whose vision model is not read and is written back unchanged; what it cannot
// compute refused in one line.
TEST(HfFamily, Llama4ResolvesItsLayersAndKeepsItsVisionModel) {
  const nlohmann::json text{{"vocab_size", 40}, {"hidden_size", 16}, {"intermediate_size", 8}, {"intermediate_size_mlp", 24},
                            {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 4},
                            {"num_local_experts", 2}, {"interleave_moe_layer_step", 2}, {"attention_chunk_size", 4}};
  // no_rope_layers empty, as Maverick's config.json has it: the default.
  const std::string dir = write_model("llama4", with(text, {{"architectures", {"Llama4ForCausalLM"}}, {"no_rope_layers", nlohmann::json::array()}}));
  const nlohmann::json layers = models::read_hf_spec(dir, 8, "test").layers["layers"];
  for (int i = 0; i < 4; ++i) {
    const nlohmann::json& b = layers[1 + i];
    EXPECT_EQ(b.value("rotary", true), i != 3) << i;
    EXPECT_EQ(b.value("attention_chunk", 0), i != 3 ? 4 : 0) << i;
    EXPECT_EQ(b.value("qk_l2_norm", false), i != 3) << i;
    EXPECT_EQ(b.value("q_temperature", 0.0), i == 3 ? 0.1 : 0.0) << i;
    EXPECT_EQ(b.value("experts", 0), i % 2 ? 2 : 0) << i;
    EXPECT_EQ(b["d_ff"], i % 2 ? 8 : 24) << i;
  }
  {
    models::SafetensorsCheckpoint ck(dir);
    const at::Tensor gate_up = ck.get("model.layers.3.feed_forward.experts.gate_up_proj");
    ASSERT_EQ(gate_up.sizes(), (std::vector<int64_t>{2, 16, 16}));
    auto p = build(dir, 8).layers->named_parameters();
    EXPECT_TRUE(torch::equal(p["layer_3.llama.mlp.experts.1.up_proj.weight"], gate_up[1].narrow(1, 8, 8).t()));
    EXPECT_TRUE(torch::equal(p["layer_2.llama.mlp.down_proj.weight"], ck.get("model.layers.2.feed_forward.down_proj.weight")));
  }
  auto refused = [&](const nlohmann::json& config, const std::string& expected) {
    std::ofstream(dir + "/config.json") << config.dump(2);
    const std::string error = hf_error(dir);
    EXPECT_NE(error.find(expected), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  };
  const nlohmann::json causal = with(text, {{"architectures", {"Llama4ForCausalLM"}}});
  refused(with(causal, {{"layer_types", {"full_attention", "sliding_attention", "full_attention", "full_attention"}}}),
          "layer_types '\"sliding_attention\"' is not supported (full_attention, chunked_attention)");
  refused(with(causal, {{"attention_chunk_size", nullptr}, {"layer_types", {"chunked_attention", "full_attention", "full_attention", "full_attention"}}}),
          "attention_chunk_size is required by layer_types' chunked_attention");
  refused(with(causal, {{"moe_layers", {1, 9}}}), "moe_layers holds 9, not a layer in [0, 4)");
  refused({{"architectures", {"Llama4ForConditionalGeneration"}}}, "text_config must be an object (the language model's config)");

  // The published form: the language model under language_model., beside a vision model.
  const std::string vision = write_model("llama4-vision", {{"architectures", {"Llama4ForConditionalGeneration"}}, {"model_type", "llama4"},
                                                           {"text_config", text}, {"vision_config", {{"hidden_size", 8}}}});
  models::SafetensorsCheckpoint ck(vision);
  EXPECT_TRUE(ck.contains("language_model.model.layers.1.feed_forward.router.weight"));
  models::NamedTensors all;
  for (const std::string& n : ck.names()) all.emplace_back(n, ck.get(n).clone());
  const at::Tensor patch = torch::randn({8, 3}), projector = torch::randn({16, 8});
  all.emplace_back("vision_model.patch_embedding.linear.weight", patch);
  all.emplace_back("multi_modal_projector.linear_1.weight", projector);
  models::save_safetensors(vision + "/model.safetensors", all);
  models::Model m = build(vision, 8);
  std::map<std::string, at::Tensor> weights;
  for (const auto& p : m.layers->named_parameters()) weights[p.key()] = p.value();
  models::save_hf(vision, weights, root() + "/llama4-exported", uint64_t{1} << 30);
  models::SafetensorsCheckpoint out(root() + "/llama4-exported");
  std::vector<std::string> names;  // the source's, the vision model's among them
  for (const auto& t : all) names.push_back(t.first);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(out.names(), names);
  EXPECT_TRUE(torch::equal(out.get("vision_model.patch_embedding.linear.weight"), patch));
  EXPECT_TRUE(torch::equal(out.get("multi_modal_projector.linear_1.weight"), projector));
  all.emplace_back("vision_tower.extra.weight", torch::zeros({2}));
  models::save_safetensors(vision + "/model.safetensors", all);
  EXPECT_NE(hf_error(vision).find("tensor 'vision_tower.extra.weight' is not part of a Llama4ForConditionalGeneration"), std::string::npos)
      << hf_error(vision);
}

// The rope parameters as transformers resolves them (and Gemma 3's two: its sliding layers' and
// the others'): Phi-3's "su" (and "yarn") is its longrope,
// its pretraining length a top-level original_max_position_embeddings, 4096 where config.json
// has none; a factor not given is the positions' ratio to it; elsewhere the length is the rope
// parameters' (a top-level one unread), else the positions'.
TEST(HfFamily, RopeParametersResolveAsTransformersDoes) {
  auto rope_of = [](const std::string& name, const nlohmann::json& config) {
    const std::string dir = root() + "/rope-" + name;
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/config.json") << config.dump();
    const nlohmann::json layers = models::read_hf_spec(dir, 8, "test").layers["layers"];
    return layers[1].value("rope_scaling", nlohmann::json::object());
  };
  const nlohmann::json phi3 = with(kLlamaConfig, {{"architectures", {"Phi3ForCausalLM"}},
                                                  {"max_position_embeddings", 131072},
                                                  {"rope_scaling", {{"type", "su"}, {"short_factor", {1.0, 1.5}}, {"long_factor", {2.0, 4.0}}}}});
  const nlohmann::json su = rope_of("su", phi3);
  EXPECT_EQ(su["rope_type"], "longrope");
  EXPECT_EQ(su["original_max_position_embeddings"], 4096);
  EXPECT_EQ(su["factor"], 32.0);
  const nlohmann::json yarn = rope_of("yarn", with(kLlamaConfig, {{"max_position_embeddings", 4096}, {"original_max_position_embeddings", 1024},
                                                                  {"rope_scaling", {{"rope_type", "yarn"}, {"original_max_position_embeddings", 2048}}}}));
  EXPECT_EQ(yarn["original_max_position_embeddings"], 2048);
  EXPECT_EQ(yarn["factor"], 2.0);
  const nlohmann::json positions = rope_of("positions", with(kLlamaConfig, {{"max_position_embeddings", 4096}, {"original_max_position_embeddings", 1024},
                                                                            {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}}));
  EXPECT_EQ(positions["original_max_position_embeddings"], 4096);
  EXPECT_EQ(positions["factor"], 4.0);
  EXPECT_EQ(rope_of("default", kLlamaConfig), nlohmann::json::object());
  // dynamic: the default frequencies within max_position_embeddings; beyond them (the windows of
  // 8 here), the list's dynamic rope from there.
  const nlohmann::json dynamic{{"rope_type", "dynamic"}, {"factor", 4.0}};
  EXPECT_EQ(rope_of("dynamic-within", with(kLlamaConfig, {{"max_position_embeddings", 8}, {"rope_scaling", dynamic}})),
            nlohmann::json::object());
  EXPECT_EQ(rope_of("dynamic-beyond", with(kLlamaConfig, {{"max_position_embeddings", 6}, {"rope_scaling", dynamic}})),
            (nlohmann::json{{"rope_type", "dynamic"}, {"factor", 4.0}, {"original_max_position_embeddings", 6}}));
  // Gemma 3 as the Hub writes it: rope_theta and rope_scaling for the full layers (every sixth),
  // rope_local_base_freq for the sliding ones.
  const std::string dir = root() + "/rope-gemma3";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << with(kLlamaConfig, {{"architectures", {"Gemma3ForCausalLM"}}, {"num_hidden_layers", 6},
                                                             {"head_dim", 4}, {"sliding_window", 4}, {"rope_theta", 1e6},
                                                             {"rope_local_base_freq", 1e4},
                                                             {"rope_scaling", {{"rope_type", "linear"}, {"factor", 8.0}}}})
                                             .dump();
  const nlohmann::json layers = models::read_hf_spec(dir, 8, "test").layers["layers"];
  for (int i = 0; i < 6; ++i) {
    const nlohmann::json& b = layers[1 + i];
    EXPECT_EQ(b.value("sliding_window", 0), i == 5 ? 0 : 4) << i;
    EXPECT_EQ(b["rope_theta"], i == 5 ? 1e6 : 1e4) << i;
    EXPECT_EQ(b.contains("rope_scaling"), i == 5) << i;
  }
}

// SmolLM3 as the Hub writes it, without no_rope_layers or layer_types: every fourth layer
// without rotary positions (no_rope_layer_interval), windowed where use_sliding_window; the
// head tied by default. A malformed list is one line naming it.
TEST(HfFamily, SmolLM3DefaultsAsTransformersResolveThem) {
  const std::string dir = root() + "/smollm3-defaults";
  std::filesystem::create_directories(dir);
  auto layers_of = [&](const nlohmann::json& changes) {
    std::ofstream(dir + "/config.json") << with(kLlamaConfig, changes).dump();
    return models::read_hf_spec(dir, 8, "test").layers;
  };
  const nlohmann::json smol{{"architectures", {"SmolLM3ForCausalLM"}}, {"num_hidden_layers", 8}, {"tie_word_embeddings", nullptr}};
  nlohmann::json spec = layers_of(smol);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(spec["layers"][1 + i].value("rotary", true), (i + 1) % 4 != 0) << i;
    EXPECT_FALSE(spec["layers"][1 + i].contains("sliding_window")) << i;
  }
  EXPECT_TRUE(spec.contains("ties"));
  nlohmann::json windowed = smol;
  windowed.update({{"use_sliding_window", true}, {"sliding_window", 4}, {"no_rope_layer_interval", 2}});
  spec = layers_of(windowed);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(spec["layers"][1 + i].value("sliding_window", 0), i % 2 ? 4 : 0) << i;
  nlohmann::json bad = smol;
  bad["no_rope_layers"] = {1, 0, 2, 1, 1, 1, 1, 1};
  try {
    layers_of(bad);
    ADD_FAILURE() << "no_rope_layers holding 2";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no_rope_layers holds 2, not 0 or 1"), std::string::npos) << e.what();
  }
}

// Phi-3's fused tensors: q, k and v are rows of one, gate and up of another; one of another size
// is refused naming it and the size config.json makes it.
TEST(HfFamily, FusedTensorsAreSplitAndChecked) {
  const nlohmann::json phi3 = with(kLlamaConfig, {{"architectures", {"Phi3ForCausalLM"}}, {"model_type", "phi3"}});
  const std::string dir = write_model("phi3", phi3);
  models::SafetensorsCheckpoint ck(dir);
  const at::Tensor qkv = ck.get("model.layers.1.self_attn.qkv_proj.weight");
  ASSERT_EQ(qkv.sizes(), (std::vector<int64_t>{32, 16}));  // 4 query heads and 2 key and value heads of 4
  models::Model m = build(dir, 8);
  auto p = m.layers->named_parameters();
  EXPECT_TRUE(torch::equal(p["layer_1.llama.self_attn.k_proj.weight"], qkv.narrow(0, 16, 8)));
  EXPECT_TRUE(torch::equal(p["layer_1.llama.mlp.up_proj.weight"], ck.get("model.layers.1.mlp.gate_up_proj.weight").narrow(0, 24, 24)));
  models::NamedTensors all;
  for (const std::string& n : ck.names())
    all.emplace_back(n, n == "model.layers.0.self_attn.qkv_proj.weight" ? torch::zeros({30, 16}) : ck.get(n).clone());
  models::save_safetensors(dir + "/model.safetensors", all);
  EXPECT_NE(hf_error(dir).find("tensor 'model.layers.0.self_attn.qkv_proj.weight' has shape [30, 16], config.json makes it [32, 16]"),
            std::string::npos)
      << hf_error(dir);
}

// GraniteMoE's experts in two stacks per layer: input_linear [experts, 2·d_ff, d] (each expert's
// gate, then up) and output_linear [experts, d, d_ff]; read expert by expert, written back whole.
TEST(HfFamily, StackedExpertTensorsAreSplitAndChecked) {
  const nlohmann::json granite = with(kLlamaConfig, {{"architectures", {"GraniteMoeForCausalLM"}}, {"model_type", "granitemoe"},
                                                     {"num_local_experts", 3}, {"num_experts_per_tok", 2}});
  const std::string dir = write_model("granitemoe", granite);
  models::SafetensorsCheckpoint ck(dir);
  const at::Tensor in = ck.get("model.layers.1.block_sparse_moe.input_linear.weight");
  const at::Tensor out = ck.get("model.layers.1.block_sparse_moe.output_linear.weight");
  ASSERT_EQ(in.sizes(), (std::vector<int64_t>{3, 48, 16}));
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{3, 16, 24}));
  EXPECT_EQ(ck.get("model.layers.1.block_sparse_moe.router.layer.weight").sizes(), (std::vector<int64_t>{3, 16}));
  models::Model m = build(dir, 8);
  auto p = m.layers->named_parameters();
  EXPECT_TRUE(torch::equal(p["layer_1.llama.mlp.experts.2.gate_proj.weight"], in[2].narrow(0, 0, 24)));
  EXPECT_TRUE(torch::equal(p["layer_1.llama.mlp.experts.2.up_proj.weight"], in[2].narrow(0, 24, 24)));
  EXPECT_TRUE(torch::equal(p["layer_1.llama.mlp.experts.1.down_proj.weight"], out[1]));
  EXPECT_FALSE(torch::equal(in[1], in[2]));
  // Two experts' worth where config.json says three, and a stack of the wrong rank.
  models::NamedTensors original;
  for (const std::string& n : ck.names()) original.emplace_back(n, ck.get(n).clone());
  for (const auto& [stack, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"input_linear", {2, 48, 16}}, {"output_linear", {16, 24}}}) {
    const std::string name = "model.layers.0.block_sparse_moe." + stack + ".weight";
    models::NamedTensors all = original;
    for (auto& t : all)
      if (t.first == name) t.second = torch::zeros(shape);
    models::save_safetensors(dir + "/model.safetensors", all);
    const std::string error = hf_error(dir);
    EXPECT_NE(error.find("tensor '" + name + "' has shape "), std::string::npos) << error;
    EXPECT_NE(error.find("config.json makes it a stack of 3 tensors of 2 dimensions"), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
}

TEST(HfFamily, ExportAsHfWritesTheSourcesFormAndOnlyForTheFamily) {
  const std::string dir = write_model("export", with(kLlamaConfig, {{"tie_word_embeddings", true}}));
  const std::string cfg = root() + "/export.json";
  std::ofstream(cfg) << nlohmann::json{{"model", {{"family", "hf"}, {"path", dir}, {"seq_len", 8}}}}.dump();
  const auto ok = test::shell(std::string(PIPETRAIN_BINARY) + " export " + cfg + " " + root() + "/exported --format hf --initial 2>&1");
  ASSERT_EQ(ok.status, 0) << ok.out;
  models::SafetensorsCheckpoint source(dir), written(root() + "/exported");
  EXPECT_EQ(source.names(), written.names());  // the tied head left out, as save_pretrained does
  for (const std::string& n : source.names()) EXPECT_TRUE(torch::equal(source.get(n), written.get(n))) << n;
  const std::string gpt = root() + "/gpt.json";
  std::ofstream(gpt) << nlohmann::json{{"model", {{"family", "gpt"}}}}.dump();
  const auto refused = test::shell(std::string(PIPETRAIN_BINARY) + " export " + gpt + " " + root() + "/no --format hf --initial 2>&1");
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.out.find("is a model of family 'gpt'; --format hf writes a model built from a Hugging Face directory"),
            std::string::npos)
      << refused.out;
}

// EXAONE 4's and GLM-4's defaults as transformers resolves them: EXAONE 4's windows on
// sliding_window_pattern - 1 of each sliding_window_pattern layers, the others without rotary
// positions, every layer rotated and none windowed where sliding_window is null, a pattern
// written as a string only with layer_types; GLM-4's half-rotated heads as interleaved pairs and
// its q/k/v biases on by default; MiniMax-M2's rotary_dim (its published checkpoints' spelling of
// the rotated share of a head).
TEST(HfFamily, Exaone4Glm4AndMiniMaxM2DefaultsAsTransformersResolveThem) {
  const std::string dir = root() + "/exaone4-defaults";
  std::filesystem::create_directories(dir);
  auto layers_of = [&](const nlohmann::json& changes) {
    std::ofstream(dir + "/config.json") << with(kLlamaConfig, changes).dump();
    return models::read_hf_spec(dir, 8, "test").layers["layers"];
  };
  const nlohmann::json exaone{{"architectures", {"Exaone4ForCausalLM"}}, {"num_hidden_layers", 4}, {"sliding_window", 4}};
  nlohmann::json layers = layers_of(exaone);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(layers[1 + i].value("sliding_window", 0), i < 3 ? 4 : 0) << i;
    EXPECT_EQ(layers[1 + i].value("rotary", true), i < 3) << i;
    EXPECT_EQ(layers[1 + i]["norms"], "post") << i;
    EXPECT_EQ(layers[1 + i]["qk_norm"], true) << i;
  }
  layers = layers_of(with(exaone, {{"sliding_window", nullptr}}));
  for (int i = 0; i < 4; ++i) {
    EXPECT_FALSE(layers[1 + i].contains("sliding_window")) << i;
    EXPECT_TRUE(layers[1 + i].value("rotary", true)) << i;
  }
  try {
    layers_of(with(exaone, {{"sliding_window_pattern", "LLLG"}}));
    ADD_FAILURE() << "a pattern as a string without layer_types";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("sliding_window_pattern must be an integer where layer_types is not given, got \"LLLG\""),
              std::string::npos)
        << e.what();
  }
  layers = layers_of(with(exaone, {{"sliding_window_pattern", "LLLG"},
                                   {"layer_types", {"sliding_attention", "full_attention", "sliding_attention", "full_attention"}}}));
  EXPECT_EQ(layers[2].value("rotary", true), false);
  EXPECT_EQ(layers[3].value("sliding_window", 0), 4);
  const nlohmann::json glm = layers_of({{"architectures", {"Glm4ForCausalLM"}}, {"head_dim", 8}})[1];
  EXPECT_EQ(glm["partial_rotary_factor"], 0.5);
  EXPECT_EQ(glm["rope_interleave"], true);
  EXPECT_EQ(glm["rope_pairs_kept"], true);
  EXPECT_EQ(glm["qkv_bias"], true);
  EXPECT_EQ(glm["o_bias"], false);
  EXPECT_EQ(glm["norms"], "sandwich");
  const nlohmann::json minimax =
      layers_of({{"architectures", {"MiniMaxM2ForCausalLM"}}, {"head_dim", 8}, {"rotary_dim", 2}, {"num_local_experts", 4}, {"num_experts_per_tok", 2}})[2];
  EXPECT_EQ(minimax["partial_rotary_factor"], 0.25);
  EXPECT_EQ(minimax["qk_norm_over"], "projection");
  EXPECT_EQ(minimax["router"], "sigmoid");
  EXPECT_EQ(minimax["router_bias"], true);
}

// Hunyuan's NTK alpha rope is read as the base it fixes, theta·alpha^(D/(D−2)), its q/k norms put
// after the rotation under their names; an alpha without head_dim (which transformers reads for
// it) or below 0 is refused by name. Against transformers: HfParity.HunyuanQkNorms*.
TEST(HfFamily, HunyuanAlphaRopeAndItsRefusals) {
  const std::string dir = root() + "/hunyuan-defaults";
  std::filesystem::create_directories(dir);
  auto spec_of = [&](const nlohmann::json& changes) {
    std::ofstream(dir + "/config.json") << with(kLlamaConfig, changes).dump();
    return models::read_hf_spec(dir, 8, "test");
  };
  const nlohmann::json hunyuan{{"architectures", {"HunYuanDenseV1ForCausalLM"}}, {"model_type", "hunyuan_v1_dense"}, {"head_dim", 8},
                               {"rope_parameters", {{"rope_type", "dynamic"}, {"alpha", 1000.0}, {"rope_theta", 10000.0}, {"factor", 1.0}}}};
  const models::HfSpec spec = spec_of(hunyuan);
  EXPECT_DOUBLE_EQ(spec.layers["layers"][1]["rope_theta"].get<double>(), 10000.0 * std::pow(1000.0, 8.0 / 6.0));
  EXPECT_FALSE(spec.layers["layers"][1].contains("rope_scaling"));
  EXPECT_EQ(spec.layers["layers"][1]["qk_norm_after_rope"], true);
  EXPECT_TRUE(std::any_of(spec.tensors.begin(), spec.tensors.end(), [](const models::HfTensor& t) {
    return t.ours == "layer_0.llama.self_attn.q_norm.weight" && t.theirs == "model.layers.0.self_attn.query_layernorm.weight";
  }));
  auto refused = [&](const nlohmann::json& changes, const std::string& expected) {
    try {
      spec_of(changes);
      ADD_FAILURE() << "read: " << changes.dump();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  nlohmann::json no_head_dim = hunyuan;
  no_head_dim.erase("head_dim");
  refused(no_head_dim, "head_dim is required with the alpha rope");
  refused(with(hunyuan, {{"rope_parameters", {{"rope_type", "dynamic"}, {"alpha", -1.0}, {"rope_theta", 10000.0}}}}),
          "rope_parameters.alpha must be above 0, got -1");
}


// Cohere (Command R, Aya) and Cohere 2: one centered norm a layer feeding attention and the MLP side by side,
// layer_norm_eps, the rotation of interleaved pairs in float32 from tables in the model's type,
// the logits times logit_scale (0.0625 by default), a tied head and padding row by default; Command
// R+'s q/k LayerNorms of each head (use_qk_norm), which Cohere 2 does not read.
TEST(HfFamily, CohereResolvesItsParallelLayersAndRefusals) {
  nlohmann::json cohere = with(kLlamaConfig, {{"architectures", {"CohereForCausalLM"}}, {"model_type", "cohere"}, {"layer_norm_eps", 1e-4}});
  cohere.erase("tie_word_embeddings");
  const std::string dir = write_model("cohere", cohere);
  const models::HfSpec spec = models::read_hf_spec(dir, 8, "test");
  const nlohmann::json& layers = spec.layers["layers"];
  EXPECT_EQ(layers[0]["padding_idx"], 0);
  const nlohmann::json& b = layers[1];
  EXPECT_EQ(b["norms"], "parallel");
  EXPECT_EQ(b["norm_center"], true);
  EXPECT_EQ(b["eps"], 1e-4);
  EXPECT_EQ(b["rope_interleave"], true);
  EXPECT_EQ(b["rope_tables_rounded"], true);
  EXPECT_EQ(layers[3]["center"], true);  // the last norm
  EXPECT_EQ(layers.back()["type"], "scale");
  EXPECT_EQ(layers.back()["by"], 0.0625);
  EXPECT_TRUE(spec.tied);
  EXPECT_FALSE(std::any_of(spec.tensors.begin(), spec.tensors.end(),
                           [](const models::HfTensor& t) { return t.theirs.find("post_attention_layernorm") != std::string::npos; }));
  models::Model m = build(dir, 8);
  EXPECT_EQ(m.layers->forward(torch::randint(0, 40, {2, 8})).sizes(), (std::vector<int64_t>{2, 8, 40}));
  std::ofstream(dir + "/config.json") << with(cohere, {{"logit_scale", 1.0}}).dump();
  EXPECT_NE(models::read_hf_spec(dir, 8, "test").layers["layers"].back()["type"], "scale");
  // Command R+'s q/k norms: each head its own weight, centered as the layer's norms.
  const std::string plus_dir = write_model("cohere_plus", with(cohere, {{"use_qk_norm", true}}));
  const models::HfSpec plus = models::read_hf_spec(plus_dir, 8, "test");
  EXPECT_EQ(plus.layers["layers"][1]["qk_norm"], true);
  EXPECT_EQ(plus.layers["layers"][1]["qk_norm_over"], "each_head");
  EXPECT_TRUE(std::any_of(plus.tensors.begin(), plus.tensors.end(),
                          [](const models::HfTensor& t) { return t.theirs == "model.layers.0.self_attn.k_norm.weight"; }));
  const models::Model heads = build(plus_dir, 8);
  models::SafetensorsCheckpoint plus_weights(plus_dir);
  EXPECT_TRUE(torch::equal(heads.layers->named_parameters()["layer_1.llama.self_attn.q_norm.weight"],
                           plus_weights.get("model.layers.0.self_attn.q_norm.weight")));
  EXPECT_EQ(heads.layers->named_parameters()["layer_1.llama.self_attn.k_norm.weight"].sizes(), (std::vector<int64_t>{2, 4}));  // [heads, head_dim]
  std::ofstream(dir + "/config.json") << with(cohere, {{"logit_scale", 0.0}}).dump();
  EXPECT_NE(test::hf_error(dir).find("logit_scale must not be 0"), std::string::npos) << test::hf_error(dir);
  // Cohere 2: windows on three layers of four by default (sliding_window_pattern), rotating; the
  // full layers without positions, nor the rotation's options.
  const nlohmann::json cohere2 = with(cohere, {{"architectures", {"Cohere2ForCausalLM"}}, {"model_type", "cohere2"}, {"num_hidden_layers", 4},
                                               {"sliding_window", 4}});
  std::ofstream(dir + "/config.json") << cohere2.dump();
  const nlohmann::json windowed = models::read_hf_spec(dir, 8, "test").layers["layers"];
  for (int i = 1; i <= 3; ++i) EXPECT_EQ(windowed[static_cast<size_t>(i)]["sliding_window"], 4) << i;
  EXPECT_FALSE(windowed[4].contains("sliding_window"));
  EXPECT_EQ(windowed[4]["rotary"], false);
  EXPECT_FALSE(windowed[4].contains("rope_interleave"));
  EXPECT_EQ(windowed[1]["rope_interleave"], true);
  std::ofstream(dir + "/config.json") << with(cohere2, {{"use_qk_norm", true}}).dump();
  EXPECT_EQ(models::read_hf_spec(dir, 8, "test").layers["layers"][1]["qk_norm"], false);
}
