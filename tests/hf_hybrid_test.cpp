// The hf family's Mamba 2 hybrids without transformers (Granite 4.0-H, Nemotron-H, Bamba): a directory
// written here in save_pretrained's form, how its config resolves into blocks, and what it
// refuses, each in one line naming the field. Against transformers: hf_test.cpp
// (HfParity.GraniteMoeHybrid*, HfParity.NemotronH*, HfParity.Bamba*).
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "models/hf.h"
#include "models/model.h"
#include "tests/hf_oracle.h"

using namespace pipetrain;

namespace {

std::string write_model(const std::string& name, const nlohmann::json& config) {
  return test::hf_write_model(test::scratch_dir("hf_hybrid") + "/" + name, config);
}

models::Model build(const std::string& dir, int64_t seq_len) { return test::hf_build(dir, seq_len); }

using test::hf_error;

using test::with;

// The model built from `dir` holds each of `pairs`' checkpoint tensors (theirs) under our name.
void expect_read_as(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& pairs) {
  models::Model m = build(dir, 8);
  models::SafetensorsCheckpoint ck(dir);
  auto params = m.layers->named_parameters();
  for (const auto& [ours, theirs] : pairs) {
    ASSERT_TRUE(params.contains(ours)) << ours;
    EXPECT_TRUE(torch::equal(params[ours], ck.get(theirs))) << ours << " <- " << theirs;
  }
}

// `config` written into `dir` is refused with an error holding `what`.
void expect_refused(const std::string& dir, const nlohmann::json& config, const std::string& what) {
  std::ofstream(dir + "/config.json") << config.dump(2);
  const std::string error = hf_error(dir);
  EXPECT_NE(error.find(what), std::string::npos) << error;
}

}  // namespace

// Granite 4.0-H (GraniteMoeHybrid): its layer_types (the legacy "mamba"/"attention" and the new
// names), its Mamba 2 arguments as transformers resolves them (mamba_d_head "auto", time_step_limit
// with Infinity as transformers writes it), no positions without position_embedding_type "rope",
// its shared MLP the dense one without experts, and what it refuses.
TEST(HfFamily, GraniteHybridResolvesItsMambaLayersAndRefusals) {
  const nlohmann::json config{{"architectures", {"GraniteMoeHybridForCausalLM"}}, {"model_type", "granitemoehybrid"}, {"vocab_size", 40},
                              {"hidden_size", 16}, {"intermediate_size", 24}, {"shared_intermediate_size", 20}, {"num_hidden_layers", 3},
                              {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"num_local_experts", 0},
                              {"layer_types", {"mamba", "attention", "linear_attention"}}, {"mamba_n_heads", 4}, {"mamba_d_head", "auto"},
                              {"mamba_d_state", 8}, {"mamba_n_groups", 2}, {"mamba_chunk_size", 4},
                              {"time_step_limit", {0.0, {{"__float__", "Infinity"}}}}, {"position_embedding_type", nullptr}};
  const std::string dir = write_model("granite_hybrid", config);
  const models::HfSpec spec = models::read_hf_spec(dir, 8, "test");
  const nlohmann::json& layers = spec.layers["layers"];
  const nlohmann::json& mamba = layers[1];  // after the embedding
  EXPECT_EQ(mamba["mamba_heads"], 4);
  EXPECT_EQ(mamba["mamba_head_dim"], 8);  // 2 x hidden_size / heads
  EXPECT_EQ(mamba["mamba_groups"], 2);
  EXPECT_FALSE(mamba.contains("mamba_dt_max"));  // Infinity: no clamp above
  EXPECT_EQ(mamba["d_ff"], 20);                  // the shared MLP's width: no experts
  EXPECT_EQ(mamba["rotary"], false);
  EXPECT_FALSE(layers[2].contains("mamba_heads"));
  EXPECT_EQ(layers[2]["rotary"], false);
  EXPECT_TRUE(layers[3].contains("mamba_heads"));
  models::Model m = build(dir, 8);
  models::SafetensorsCheckpoint ck(dir);
  auto params = m.layers->named_parameters();
  EXPECT_TRUE(torch::equal(params["layer_0.llama.mamba.in_proj.weight"], ck.get("model.layers.0.mamba.in_proj.weight")));
  EXPECT_TRUE(torch::equal(params["layer_1.llama.mlp.up_proj.weight"], ck.get("model.layers.1.shared_mlp.input_linear.weight").narrow(0, 20, 20)));
  // Rotary positions with "rope"; a finite clamp of the steps.
  const std::string rope = write_model("granite_hybrid_rope", with(config, {{"position_embedding_type", "rope"}, {"time_step_limit", {0.001, 0.1}}}));
  const nlohmann::json roped = models::read_hf_spec(rope, 8, "test").layers["layers"];
  EXPECT_FALSE(roped[2].contains("rotary"));
  EXPECT_EQ(roped[1]["mamba_dt_min"], 0.001);
  EXPECT_EQ(roped[1]["mamba_dt_max"], 0.1);
  auto refused = [&](const nlohmann::json& changes, const std::string& what) { expect_refused(dir, with(config, changes), what); };
  refused({{"layer_types", {"mamba", "sliding_attention", "mamba"}}}, "layer_types '\"sliding_attention\"' is not supported (mamba, attention");
  refused({{"layer_types", {"mamba"}}}, "layer_types must list 3 layers");
  refused({{"position_embedding_type", "alibi"}}, "position_embedding_type 'alibi' is not supported (rope, nope or null)");
  refused({{"mamba_d_head", 6}}, "mamba_d_head 6 x mamba_n_heads (4) is not mamba_expand x hidden_size (32)");
  refused({{"mamba_n_groups", 3}}, "mamba_n_groups must divide mamba_n_heads (4)");
  refused({{"time_step_limit", {0.0, "inf"}}}, "time_step_limit must hold numbers (or Infinity), got \"inf\"");
  refused({{"time_step_limit", {0.5, 0.1}}}, "time_step_limit must be 0 <= min <= max");
}

// Nemotron-H: its blocks as layers_block_type names them (new and old names) or as
// hybrid_override_pattern spells them, each block one part under backbone., its Mamba settings
// under their names and their older ones, and what it refuses.
TEST(HfFamily, NemotronHResolvesItsBlocksAndRefusals) {
  const nlohmann::json config{{"architectures", {"NemotronHForCausalLM"}}, {"model_type", "nemotron_h"}, {"vocab_size", 40},
                              {"hidden_size", 16}, {"hybrid_override_pattern", "M-*E"}, {"num_hidden_layers", 4},
                              {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"head_dim", 8}, {"intermediate_size", 24},
                              {"mamba_num_heads", 4}, {"mamba_head_dim", 4}, {"ssm_state_size", 4}, {"mamba_n_groups", 2},
                              {"mamba_d_conv", 3}, {"n_routed_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 8},
                              {"moe_shared_expert_intermediate_size", 6}, {"n_group", 2}, {"topk_group", 1}, {"time_step_min", 0.002}};
  const std::string dir = write_model("nemotron_h", config);
  const models::HfSpec spec = models::read_hf_spec(dir, 8, "test");
  const nlohmann::json& layers = spec.layers["layers"];
  EXPECT_EQ(layers[1]["mamba_groups"], 2);  // mamba_n_groups, the older name
  EXPECT_EQ(layers[1]["mamba_conv_kernel"], 3);
  EXPECT_EQ(layers[1]["mamba_dt_min"], 0.002);
  EXPECT_EQ(layers[1]["mlp"], false);
  EXPECT_EQ(layers[2]["mixer"], false);
  EXPECT_EQ(layers[3]["mlp"], false);
  EXPECT_EQ(layers[3]["rotary"], false);
  EXPECT_EQ(layers[4]["experts"], 4);
  EXPECT_EQ(layers[4]["experts_sum_float32"], true);
  expect_read_as(dir, {{"layer_0.llama.input_layernorm.weight", "backbone.layers.0.norm.weight"},
                       {"layer_1.llama.post_attention_layernorm.weight", "backbone.layers.1.norm.weight"},
                       {"layer_3.llama.mlp.experts.2.up_proj.weight", "backbone.layers.3.mixer.experts.2.up_proj.weight"}});
  EXPECT_FALSE(build(dir, 8).layers->named_parameters().contains("layer_1.llama.input_layernorm.weight"));
  // The same blocks by layers_block_type's new names.
  const nlohmann::json typed = with(config, {{"layers_block_type", {"linear_attention", "mlp", "full_attention", "moe"}}});
  EXPECT_EQ(models::read_hf_spec(write_model("nemotron_h_typed", typed), 8, "test").layers, spec.layers);
  auto refused = [&](const nlohmann::json& changes, const std::string& what) { expect_refused(dir, with(config, changes), what); };
  refused({{"hybrid_override_pattern", "M-X"}}, "hybrid_override_pattern holds 'X', not M, *, - or E");
  refused({{"num_hidden_layers", 5}}, "num_hidden_layers must equal the 4 blocks the types name");
  refused({{"tie_word_embeddings", true}}, "tie_word_embeddings true is not supported for NemotronHForCausalLM (transformers does not tie");
  refused({{"num_nextn_predict_layers", 1}}, "num_nextn_predict_layers above 0 is not supported");
  refused({{"mlp_hidden_act", "silu"}}, "mlp_hidden_act 'silu' is not supported (relu2)");
  refused({{"mamba_n_groups", 3}}, "n_groups must divide mamba_num_heads (4)");
  refused({{"sliding_window", 4}}, "sliding_window is not supported");
}

// Bamba: attention on attn_layer_indices (none: Mamba 2 everywhere), half of each head rotated
// unless rope_parameters says otherwise, its names (feed_forward, pre_ff_layernorm,
// final_layernorm), and what it refuses.
TEST(HfFamily, BambaResolvesItsLayersNamesAndRefusals) {
  const nlohmann::json config{{"architectures", {"BambaForCausalLM"}}, {"model_type", "bamba"}, {"vocab_size", 40}, {"hidden_size", 16},
                              {"intermediate_size", 24}, {"num_hidden_layers", 3}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                              {"attn_layer_indices", {2}}, {"mamba_n_heads", 4}, {"mamba_d_head", "auto"}, {"mamba_d_state", 8},
                              {"mamba_n_groups", 2}, {"mamba_chunk_size", 4}, {"time_step_limit", {0.0, {{"__float__", "Infinity"}}}}};
  const std::string dir = write_model("bamba", config);
  const nlohmann::json layers = models::read_hf_spec(dir, 8, "test").layers["layers"];
  EXPECT_EQ(layers[0]["padding_idx"], 0);  // transformers' default pad_token_id
  EXPECT_EQ(layers[1]["mamba_head_dim"], 8);
  EXPECT_TRUE(layers[2].contains("mamba_heads"));
  EXPECT_FALSE(layers[3].contains("mamba_heads"));
  EXPECT_EQ(layers[3]["partial_rotary_factor"], 0.5);
  EXPECT_EQ(layers[3]["eps"], 1e-5);
  expect_read_as(dir, {{"layer_0.llama.mamba.A_log", "model.layers.0.mamba.A_log"},
                       {"layer_2.llama.mlp.gate_proj.weight", "model.layers.2.feed_forward.gate_proj.weight"},
                       {"layer_2.llama.post_attention_layernorm.weight", "model.layers.2.pre_ff_layernorm.weight"},
                       {"norm.rms.weight", "model.final_layernorm.weight"}});
  const std::string whole = write_model("bamba_whole", with(config, {{"attn_layer_indices", nullptr},
                                                                      {"rope_parameters", {{"rope_type", "default"}, {"partial_rotary_factor", 1.0}}}}));
  const nlohmann::json all_mamba = models::read_hf_spec(whole, 8, "test").layers["layers"];
  for (int i = 1; i <= 3; ++i) EXPECT_TRUE(all_mamba[static_cast<size_t>(i)].contains("mamba_heads")) << i;
  const std::string full = write_model("bamba_full", with(config, {{"rope_parameters", {{"rope_type", "default"}, {"partial_rotary_factor", 1.0}}}}));
  EXPECT_FALSE(models::read_hf_spec(full, 8, "test").layers["layers"][3].contains("partial_rotary_factor"));
  auto refused = [&](const nlohmann::json& changes, const std::string& what) { expect_refused(dir, with(config, changes), what); };
  refused({{"attn_layer_indices", {3}}}, "attn_layer_indices holds 3, not a layer index in [0, 3)");
  refused({{"attn_layer_indices", 1}}, "attn_layer_indices must list layer indices, got 1");
  refused({{"z_loss_coefficient", 0.01}}, "z_loss_coefficient above 0 is not supported (the loss is cross-entropy alone");
  refused({{"mamba_n_groups", 3}}, "mamba_n_groups must divide mamba_n_heads (4)");
}
