// The hf family's language models published beside a vision tower (Gemma 3 from 4B on, Mistral 3:
// Mistral Small 3.1 and 3.2, Ministral 3; LLaVA, InternVL, Aya Vision; Qwen3-VL, Qwen2.5-VL and
// Qwen2-VL) without transformers: each reads as its language model
// does alone, under language_model., tied as the outer config says, the vision tower and projector
// left as they are and written back; what it refuses, in one line naming the field. Against
// transformers: hf_test.cpp (HfParity.Gemma3Beside*, HfParity.Mistral3Beside*, HfParity.Llava*,
// HfParity.InternVl*, HfParity.AyaVision*, HfParity.Qwen3Vl*, HfParity.Qwen25Vl*).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "models/hf.h"
#include "models/model.h"
#include "models/safetensors.h"
#include "tests/hf_oracle.h"

using namespace pipetrain;

namespace {

std::string root() { return test::scratch_dir("hf_vision"); }

std::string write_model(const std::string& name, const nlohmann::json& config) { return test::hf_write_model(root() + "/" + name, config); }

const nlohmann::json kText{{"vocab_size", 40}, {"hidden_size", 16}, {"intermediate_size", 24}, {"num_hidden_layers", 2},
                           {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 4}, {"rms_norm_eps", 1e-6}};

// The spec of `text` read as the causal language model `arch` alone, tied as `tied`.
models::HfSpec alone(const std::string& name, const std::string& arch, nlohmann::json text, bool tied) {
  text["architectures"] = {arch};
  text["tie_word_embeddings"] = tied;
  const std::string dir = root() + "/" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << text.dump();
  return models::read_hf_spec(dir, 8, "test");
}

// `config` alone (no weights) in a fresh directory.
std::string write_config(const std::string& name, const nlohmann::json& config) {
  const std::string dir = root() + "/" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config.dump();
  return dir;
}

// What reading `config` refuses (config.json alone in a fresh directory).
std::string refusal(const std::string& name, const nlohmann::json& config) {
  const std::string dir = root() + "/" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config.dump();
  return test::hf_error(dir);
}

// llava's layout (Gemma 3's, Mistral 3's): every name under language_model.
std::string llava(const std::string& name) { return "language_model." + name; }

// `outer` reads as `text` alone, each name as `named` names it; its vision tensors (`vision`'s
// two names) are not read, and are written back as they were.
void expect_language_model_beside_vision(const std::string& name, const nlohmann::json& outer, const models::HfSpec& text,
                                         const std::function<std::string(const std::string&)>& named = llava,
                                         const std::vector<std::string>& vision = {"vision_tower.vision_model.embeddings.patch_embedding.weight",
                                                                                   "multi_modal_projector.linear_1.weight"}) {
  const std::string dir = write_model(name, outer);
  const models::HfSpec spec = models::read_hf_spec(dir, 8, "test");
  EXPECT_EQ(spec.layers, text.layers);
  EXPECT_EQ(spec.tied, text.tied);
  ASSERT_EQ(spec.tensors.size(), text.tensors.size());
  for (size_t i = 0; i < spec.tensors.size(); ++i) EXPECT_EQ(spec.tensors[i].theirs, named(text.tensors[i].theirs));
  models::SafetensorsCheckpoint ck(dir);
  models::NamedTensors all;
  for (const std::string& n : ck.names()) all.emplace_back(n, ck.get(n).clone());
  const at::Tensor patch = torch::randn({8, 3}), projector = torch::randn({16, 8});
  all.emplace_back(vision[0], patch);
  all.emplace_back(vision[1], projector);
  models::save_safetensors(dir + "/model.safetensors", all);
  models::Model m = test::hf_build(dir, 8);
  std::map<std::string, at::Tensor> weights;
  for (const auto& p : m.layers->named_parameters()) weights[p.key()] = p.value();
  models::save_hf(dir, weights, root() + "/" + name + "-exported", uint64_t{1} << 30);
  models::SafetensorsCheckpoint out(root() + "/" + name + "-exported");
  std::vector<std::string> names;
  for (const auto& t : all) names.push_back(t.first);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(out.names(), names);
  EXPECT_TRUE(torch::equal(out.get(vision[0]), patch));
  EXPECT_TRUE(torch::equal(out.get(vision[1]), projector));
}

}  // namespace

// Gemma 3 beside SigLIP: tied by default (the outer config's true), its windows and two ropes as
// Gemma3ForCausalLM reads them, and no soft cap on the logits whatever text_config says (the vision
// model's head has none).
TEST(HfFamily, Gemma3BesideItsVisionTowerReadsAsItsLanguageModel) {
  const nlohmann::json text = test::with(kText, {{"model_type", "gemma3_text"}, {"sliding_window", 4},
                                                 {"layer_types", {"sliding_attention", "full_attention"}}});
  const nlohmann::json outer{{"architectures", {"Gemma3ForConditionalGeneration"}}, {"model_type", "gemma3"},
                             {"text_config", test::with(text, {{"final_logit_softcapping", 30.0}})}, {"vision_config", {{"hidden_size", 8}}}};
  const models::HfSpec gemma = alone("gemma3-text", "Gemma3ForCausalLM", text, true);
  EXPECT_TRUE(gemma.tied);
  expect_language_model_beside_vision("gemma3", outer, gemma);
  EXPECT_EQ(models::read_hf_spec(write_model("gemma3-untied", test::with(outer, {{"tie_word_embeddings", false}})), 8, "test").tied, false);
  EXPECT_NE(refusal("gemma3-llama", test::with(outer, {{"text_config", test::with(text, {{"model_type", "llama"}})}}))
                .find("text_config: model_type 'llama' is not supported for Gemma3ForConditionalGeneration (gemma3_text)"),
            std::string::npos);
}

// Mistral 3 beside Pixtral: its text model Mistral's (Mistral Small 3.1, 3.2) or Ministral 3's
// (its queries' scale by position), untied here under language_model.lm_head.
TEST(HfFamily, Mistral3BesideItsVisionTowerReadsAsItsLanguageModel) {
  const nlohmann::json mistral = test::with(kText, {{"model_type", "mistral"}, {"sliding_window", nullptr}});
  const nlohmann::json outer{{"architectures", {"Mistral3ForConditionalGeneration"}}, {"model_type", "mistral3"}, {"tie_word_embeddings", false},
                             {"text_config", mistral}, {"vision_config", {{"hidden_size", 8}}}};
  const models::HfSpec text = alone("mistral-text", "MistralForCausalLM", mistral, false);
  EXPECT_TRUE(std::any_of(text.tensors.begin(), text.tensors.end(), [](const models::HfTensor& t) { return t.theirs == "lm_head.weight"; }));
  expect_language_model_beside_vision("mistral3", outer, text);
  const nlohmann::json ministral = test::with(kText, {{"model_type", "ministral3"},
      {"rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0}, {"original_max_position_embeddings", 4},
                           {"llama_4_scaling_beta", 0.5}}}});
  const models::HfSpec small = alone("ministral3-text", "Ministral3ForCausalLM", ministral, false);
  EXPECT_TRUE(small.layers["layers"][1].contains("q_scale_beta"));
  expect_language_model_beside_vision("ministral3", test::with(outer, {{"text_config", ministral}}), small);
  EXPECT_NE(refusal("mistral3-gemma", test::with(outer, {{"text_config", test::with(mistral, {{"model_type", "gemma3_text"}})}}))
                .find("model_type 'gemma3_text' is not supported for Mistral3ForConditionalGeneration (mistral, ministral3)"),
            std::string::npos);
  EXPECT_NE(refusal("mistral3-bare", {{"architectures", {"Mistral3ForConditionalGeneration"}}})
                .find("text_config must be an object (the language model's config)"),
            std::string::npos);
}

// Qwen3-VL (and Qwen3-VL-MoE): Qwen3's language model under model.language_model., the head beside it (lm_head),
// untied by default (the outer config's false); the rotation's sections (mrope_section) read as
// Qwen3's rotation, which they are on text alone.
TEST(HfFamily, Qwen3VlReadsAsQwen3UnderModelLanguageModel) {
  const nlohmann::json text = test::with(kText, {{"model_type", "qwen3_vl_text"},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 5e5}, {"mrope_section", {1, 0, 1}}, {"mrope_interleaved", true}}}});
  const nlohmann::json outer{{"architectures", {"Qwen3VLForConditionalGeneration"}}, {"model_type", "qwen3_vl"}, {"text_config", text},
                             {"vision_config", {{"depth", 1}}}};
  const auto named = [](const std::string& n) { return n.rfind("model.", 0) == 0 ? "model.language_model." + n.substr(6) : n; };
  const std::vector<std::string> vision{"model.visual.patch_embed.proj.weight", "model.visual.merger.linear_fc1.weight"};
  const models::HfSpec qwen3 = alone("qwen3-text", "Qwen3ForCausalLM", text, false);
  EXPECT_FALSE(qwen3.tied);
  expect_language_model_beside_vision("qwen3-vl", outer, qwen3, named, vision);
  expect_language_model_beside_vision("qwen3-vl-tied", test::with(outer, {{"tie_word_embeddings", true}}),
                                      alone("qwen3-text-tied", "Qwen3ForCausalLM", text, true), named, vision);
  // Qwen3-VL-MoE: Qwen3-MoE's layers (always renormalized, heads of hidden_size / heads), each
  // layer's experts stacked and transposed: gate_up_proj [experts, hidden, 2 * width], down_proj.
  const nlohmann::json moe = test::with(text, {{"model_type", "qwen3_vl_moe_text"}, {"num_experts", 4}, {"num_experts_per_tok", 2},
                                               {"moe_intermediate_size", 6}, {"mlp_only_layers", {0}}});
  nlohmann::json as_moe = test::with(moe, {{"norm_topk_prob", true}});
  const models::HfSpec qwen3_moe = alone("qwen3-moe-text", "Qwen3MoeForCausalLM", as_moe, false);
  const std::string dir = write_model("qwen3-vl-moe", test::with(outer, {{"architectures", {"Qwen3VLMoeForConditionalGeneration"}},
                                                                          {"model_type", "qwen3_vl_moe"}, {"text_config", moe}}));
  const models::HfSpec spec = models::read_hf_spec(dir, 8, "test");
  EXPECT_EQ(spec.layers, qwen3_moe.layers);
  EXPECT_EQ(spec.layers["layers"][2]["normalize_experts"], true);
  models::SafetensorsCheckpoint ck(dir);
  EXPECT_EQ(ck.get("model.language_model.layers.1.mlp.experts.gate_up_proj").sizes(), (std::vector<int64_t>{4, 16, 12}));
  EXPECT_EQ(ck.get("model.language_model.layers.1.mlp.experts.down_proj").sizes(), (std::vector<int64_t>{4, 6, 16}));
  models::Model m = test::hf_build(dir, 8);
  auto params = m.layers->named_parameters();
  const at::Tensor gate_up = ck.get("model.language_model.layers.1.mlp.experts.gate_up_proj");
  EXPECT_TRUE(torch::equal(params["layer_1.llama.mlp.experts.3.up_proj.weight"], gate_up[3].slice(1, 6, 12).t()));
  EXPECT_TRUE(torch::equal(params["layer_1.llama.mlp.experts.2.down_proj.weight"], ck.get("model.language_model.layers.1.mlp.experts.down_proj")[2].t()));
  EXPECT_TRUE(torch::equal(params["layer_0.llama.mlp.gate_proj.weight"], ck.get("model.language_model.layers.0.mlp.gate_proj.weight")));
  // As transformers 5.24 saves them, the module's layout ([experts, 2 * width, hidden], [experts,
  // hidden, width]): read as transformers reads them, the same model.
  models::NamedTensors all;
  for (const std::string& n : ck.names())
    all.emplace_back(n, n.find("mlp.experts.") != std::string::npos ? ck.get(n).transpose(1, 2).contiguous() : ck.get(n).clone());
  models::save_safetensors(dir + "/model.safetensors", all);
  models::Model saved = test::hf_build(dir, 8);
  for (const auto& p : saved.layers->named_parameters()) EXPECT_TRUE(torch::equal(p.value(), params[p.key()])) << p.key();
}

// Qwen2.5-VL (and Qwen2-VL): Qwen2's names, the vision model under visual.; its config as
// published (the language model's fields in the outer config, rope_scaling's type "mrope") reads
// as the same model's text_config (transformers 5.24's form); its own defaults where Qwen2's differ
// (eps 1e-5, rope_theta 1e6); tied where text_config says so.
TEST(HfFamily, Qwen25VlReadsAsQwen2WithItsOwnDefaults) {
  nlohmann::json text = test::with(kText, {{"model_type", "qwen2_5_vl_text"}, {"use_sliding_window", true}, {"sliding_window", 4},
                                           {"max_window_layers", 1}, {"rope_parameters", {{"rope_type", "default"}, {"mrope_section", {1, 0, 1}}}}});
  text.erase("rms_norm_eps");  // its default, 1e-5 (Qwen2's 1e-6)
  const nlohmann::json outer{{"architectures", {"Qwen2_5_VLForConditionalGeneration"}}, {"model_type", "qwen2_5_vl"}, {"text_config", text},
                             {"vision_config", {{"depth", 1}}}};
  nlohmann::json as_qwen2 = test::with(text, {{"rms_norm_eps", 1e-5}, {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e6}}}});
  const models::HfSpec qwen2 = alone("qwen2-text", "Qwen2ForCausalLM", as_qwen2, false);
  EXPECT_EQ(qwen2.layers["layers"][1]["eps"], 1e-5);
  EXPECT_EQ(qwen2.layers["layers"][1]["rope_theta"], 1e6);
  EXPECT_FALSE(qwen2.layers["layers"][1].contains("sliding_window"));
  EXPECT_EQ(qwen2.layers["layers"][2]["sliding_window"], 4);
  const auto same = [](const std::string& n) { return n; };
  const std::vector<std::string> vision{"visual.patch_embed.proj.weight", "visual.merger.mlp.0.weight"};
  expect_language_model_beside_vision("qwen2.5-vl", outer, qwen2, same, vision);
  nlohmann::json flat = test::with(outer, text);  // as published: the text fields beside vision_config
  flat.erase("text_config");
  flat.erase("rope_parameters");
  flat["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", {1, 0, 1}}};
  flat["architectures"] = {"Qwen2_5_VLForConditionalGeneration"};
  flat["model_type"] = "qwen2_5_vl";
  expect_language_model_beside_vision("qwen2.5-vl-flat", flat, qwen2, same, vision);
  expect_language_model_beside_vision("qwen2-vl-flat", test::with(flat, {{"architectures", {"Qwen2VLForConditionalGeneration"}}}), qwen2, same,
                                      vision);
  const models::HfSpec tied = alone("qwen2-text-tied", "Qwen2ForCausalLM", as_qwen2, true);
  expect_language_model_beside_vision("qwen2.5-vl-tied", test::with(outer, {{"text_config", test::with(text, {{"tie_word_embeddings", true}})}}),
                                      tied, same, vision);
}

// LLaVA (untied by default, tied where text_config says so, as transformers forwards it), InternVL
// (tied by default; Qwen2's, Qwen3's or Llama's language model) and Aya Vision (Cohere 2's, its
// logits unscaled: the vision model's head takes no logit_scale); the language models each takes.
TEST(HfFamily, LlavaInternVlAndAyaVisionReadAsTheirLanguageModels) {
  const nlohmann::json llama = test::with(kText, {{"model_type", "llama"}});
  const nlohmann::json llava{{"architectures", {"LlavaForConditionalGeneration"}}, {"model_type", "llava"}, {"text_config", llama},
                             {"vision_config", {{"hidden_size", 8}}}};
  expect_language_model_beside_vision("llava", llava, alone("llama-text", "LlamaForCausalLM", llama, false));
  const nlohmann::json tied_text = test::with(llama, {{"tie_word_embeddings", true}});
  expect_language_model_beside_vision("llava-tied", test::with(llava, {{"text_config", tied_text}}),
                                      alone("llama-text-tied", "LlamaForCausalLM", llama, true));
  const nlohmann::json qwen3 = test::with(kText, {{"model_type", "qwen3"}});
  expect_language_model_beside_vision("internvl", test::with(llava, {{"architectures", {"InternVLForConditionalGeneration"}}, {"model_type", "internvl"},
                                                                    {"text_config", qwen3}}),
                                      alone("qwen3-text-internvl", "Qwen3ForCausalLM", qwen3, true));
  const nlohmann::json cohere2 = test::with(kText, {{"model_type", "cohere2"}, {"sliding_window", 4}, {"logit_scale", 0.5}});
  const models::HfSpec unscaled = alone("cohere2-text", "Cohere2ForCausalLM", test::with(cohere2, {{"logit_scale", 1.0}}), true);
  EXPECT_NE(unscaled.layers["layers"].back()["type"], "scale");
  expect_language_model_beside_vision("aya-vision", test::with(llava, {{"architectures", {"AyaVisionForConditionalGeneration"}}, {"model_type", "aya_vision"},
                                                                      {"text_config", cohere2}}),
                                      unscaled);
  EXPECT_NE(refusal("internvl-gemma", test::with(llava, {{"architectures", {"InternVLForConditionalGeneration"}},
                                                          {"text_config", test::with(kText, {{"model_type", "gemma"}})}}))
                .find("text_config: model_type 'gemma' is not supported for InternVLForConditionalGeneration (qwen2, qwen3, llama)"),
            std::string::npos);
}

// Published text_configs name a few fields alone (Gemma 3 4B's its sizes and rope; LLaVA 1.5's
// less): transformers completes them with the config class's defaults, and so does this.
TEST(HfFamily, AVisionModelsTextConfigIsCompletedWithItsClassDefaults) {
  const nlohmann::json gemma{{"architectures", {"Gemma3ForConditionalGeneration"}}, {"model_type", "gemma3"},
                             {"text_config", {{"model_type", "gemma3_text"}, {"hidden_size", 64}, {"intermediate_size", 96}, {"num_hidden_layers", 2}}},
                             {"vision_config", {{"hidden_size", 8}}}};
  const nlohmann::json layers = models::read_hf_spec(write_config("gemma3-4b-like", gemma), 8, "test").layers["layers"];
  EXPECT_EQ(layers[0]["num_embeddings"], 262208);  // Gemma3TextConfig's vocabulary
  EXPECT_EQ(layers[1]["n_heads"], 8);
  EXPECT_EQ(layers[1]["n_kv_heads"], 4);
  EXPECT_EQ(layers[1]["head_dim"], 256);
  const nlohmann::json llava{{"architectures", {"LlavaForConditionalGeneration"}}, {"model_type", "llava"},
                             {"text_config", {{"model_type", "llama"}, {"num_hidden_layers", 1}}}};
  const nlohmann::json llama = models::read_hf_spec(write_config("llava-1.5-like", llava), 8, "test").layers["layers"];
  EXPECT_EQ(llama[0]["num_embeddings"], 32000);  // LlamaConfig's
  EXPECT_EQ(llama[1]["d_model"], 4096);
  EXPECT_EQ(llama[1]["d_ff"], 11008);
  EXPECT_EQ(llama[1]["n_kv_heads"], 32);
  // Qwen2.5-VL as published, rope_scaling beside rope_parameters: transformers takes rope_scaling.
  const nlohmann::json qwen{{"architectures", {"Qwen2_5_VLForConditionalGeneration"}}, {"model_type", "qwen2_5_vl"}, {"num_hidden_layers", 1},
                            {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {1, 1, 2}}, {"rope_theta", 5e5}}},
                            {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  const nlohmann::json q = models::read_hf_spec(write_config("qwen2.5-vl-both", qwen), 8, "test").layers["layers"];
  EXPECT_EQ(q[1]["rope_theta"], 5e5);
  EXPECT_EQ(q[1]["d_model"], 8192);  // Qwen2_5_VLTextConfig's
}

// A config that ties the head where its checkpoint holds a head of its own, of other values: as
// transformers 5.24 reads it, untied, the checkpoint's head read (and written back); equal values
// tie as the config says.
TEST(HfFamily, AHeadTheCheckpointHoldsApartIsNotTied) {
  const nlohmann::json mistral = test::with(kText, {{"model_type", "mistral"}, {"sliding_window", nullptr}});
  const nlohmann::json outer{{"architectures", {"Mistral3ForConditionalGeneration"}}, {"model_type", "mistral3"}, {"text_config", mistral},
                             {"vision_config", {{"hidden_size", 8}}}};  // tied: Mistral3Config's default
  const std::string dir = write_model("mistral3-own-head", outer);
  models::SafetensorsCheckpoint ck(dir);
  ASSERT_FALSE(ck.contains("language_model.lm_head.weight"));
  EXPECT_TRUE(models::read_hf_spec(dir, 8, "test").tied);
  models::NamedTensors all;
  for (const std::string& n : ck.names()) all.emplace_back(n, ck.get(n).clone());
  const at::Tensor embed = ck.get("language_model.model.embed_tokens.weight");
  all.emplace_back("language_model.lm_head.weight", embed.clone());
  models::save_safetensors(dir + "/model.safetensors", all);
  EXPECT_TRUE(models::read_hf_spec(dir, 8, "test").tied);  // the same values: tied
  const at::Tensor head = torch::randn(embed.sizes());
  all.back().second = head;
  models::save_safetensors(dir + "/model.safetensors", all);
  const models::HfSpec spec = models::read_hf_spec(dir, 8, "test");
  EXPECT_FALSE(spec.tied);
  EXPECT_FALSE(spec.layers.contains("ties"));
  models::Model m = test::hf_build(dir, 8);
  EXPECT_TRUE(torch::equal(m.layers->named_parameters()["lm_head.linear.weight"], head));
  EXPECT_TRUE(torch::equal(m.layers->named_parameters()["embed.embedding.weight"], embed));
  std::map<std::string, at::Tensor> weights;
  for (const auto& p : m.layers->named_parameters()) weights[p.key()] = p.value();
  models::save_hf(dir, weights, root() + "/mistral3-own-head-exported", uint64_t{1} << 30);
  EXPECT_TRUE(torch::equal(models::SafetensorsCheckpoint(root() + "/mistral3-own-head-exported").get("language_model.lm_head.weight"), head));
}
