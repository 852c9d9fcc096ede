// GPT-NeoX, Phi, StableLM and Falcon in the hf family without transformers: their configs as published
// (older field names, nulls, defaults) read into llama_blocks with their norms, GELUs, partial
// rotations, biases and dropouts; their fused and per-head tensors read and written back in place;
// what they refuse, in one line naming the field.
// Against transformers: hf_test.cpp (HfParity.GptNeoX*, HfParity.Phi*, HfParity.StableLm*, HfParity.Falcon*).
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
#include "tests/layer_list_helpers.h"

using namespace pipetrain;

namespace {

std::string root() { return test::scratch_dir("hf_parallel"); }

bool has(const models::HfSpec& spec, const std::string& ours, const std::string& theirs) {
  return std::any_of(spec.tensors.begin(), spec.tensors.end(), [&](const models::HfTensor& t) { return t.ours == ours && t.theirs == theirs; });
}

// Pythia's config.json as published (transformers 4's names: rotary_pct, rotary_emb_base).
const nlohmann::json kPythia{{"architectures", {"GPTNeoXForCausalLM"}}, {"model_type", "gpt_neox"}, {"vocab_size", 40},
                             {"hidden_size", 16}, {"intermediate_size", 24}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                             {"rotary_pct", 0.25}, {"rotary_emb_base", 5000}, {"use_parallel_residual", true}, {"hidden_act", "gelu"},
                             {"layer_norm_eps", 1e-4}, {"tie_word_embeddings", false}, {"hidden_dropout", 0.0}, {"attention_dropout", 0.0}};

// Phi-2's (its key heads null, its resid_pdrop 0.1).
const nlohmann::json kPhi2{{"architectures", {"PhiForCausalLM"}}, {"model_type", "phi"}, {"vocab_size", 40}, {"hidden_size", 20},
                           {"intermediate_size", 24}, {"num_hidden_layers", 2}, {"num_attention_heads", 2}, {"num_key_value_heads", nullptr},
                           {"partial_rotary_factor", 0.4}, {"rope_theta", 10000.0}, {"hidden_act", "gelu_new"}, {"resid_pdrop", 0.1},
                           {"embd_pdrop", 0.0}, {"attention_dropout", 0.0}, {"qk_layernorm", false}, {"layer_norm_eps", 1e-5}};

const nlohmann::json kStableLm{{"architectures", {"StableLmForCausalLM"}}, {"model_type", "stablelm"}, {"vocab_size", 40},
                               {"hidden_size", 32}, {"intermediate_size", 24}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                               {"num_key_value_heads", 2}, {"use_qkv_bias", true}, {"qk_layernorm", true}, {"use_parallel_residual", true}};

// Every tensor of the spec read where its name says (the fused and per-head ones as their parts).
void expect_read_in_place(const std::string& dir, const models::HfSpec& spec) {
  models::Model m = test::hf_build(dir, 8);
  models::SafetensorsCheckpoint ck(dir);
  auto params = m.layers->named_parameters();
  for (const models::HfTensor& t : spec.tensors) {
    if (spec.tied && t.theirs == "lm_head.weight") continue;  // the embedding's
    ASSERT_TRUE(params.contains(t.ours)) << t.ours;
    at::Tensor ours = t.ours_row >= 0 ? params[t.ours].select(0, t.ours_row) : params[t.ours];
    at::Tensor theirs = ck.get(t.theirs);
    if (t.row_block > 1) {  // GPT-NeoX's query_key_value, [heads, 3 · head_dim, ...]; Falcon-40B's, by groups
      std::vector<int64_t> shape{-1, t.row_step};
      for (int64_t d = 1; d < theirs.dim(); ++d) shape.push_back(theirs.size(d));
      theirs = theirs.reshape(shape).narrow(1, t.row_offset, t.row_block).reshape(ours.sizes());
    } else if (t.rows > 0) {  // Falcon-7B's: the queries' rows, then the key's, then the value's
      theirs = theirs.narrow(0, t.row_offset, t.rows);
    }
    EXPECT_TRUE(torch::equal(ours, theirs)) << t.ours << " <- " << t.theirs;
  }
}

}  // namespace

TEST(HfFamily, GptNeoXReadsPythiasConfigFusedHeadsAndOldBuffers) {
  const std::string dir = test::hf_write_model(root() + "/pythia", kPythia);
  const models::HfSpec spec = models::read_hf_spec(dir, 8, "test");
  const nlohmann::json& b = spec.layers["layers"][1];
  EXPECT_EQ(b["norms"], "parallel_two");
  EXPECT_EQ(b["parallel_sum"], "branches_first");
  EXPECT_EQ(b["partial_rotary_factor"], 0.25);
  EXPECT_EQ(b["rope_theta"], 5000);
  EXPECT_EQ(b["act"], "gelu");
  EXPECT_EQ(b["eps"], 1e-4);
  EXPECT_EQ(b["mlp_gate"], false);
  EXPECT_EQ(b["qkv_bias"], true);
  EXPECT_EQ(b["o_bias"], true);
  EXPECT_EQ(b["mlp_bias"], true);
  EXPECT_EQ(b["norm_bias"], true);
  EXPECT_FALSE(spec.layers["layers"][0].contains("padding_idx"));  // its embedding has no padding row
  EXPECT_FALSE(spec.tied);
  EXPECT_TRUE(has(spec, "layer_1.llama.self_attn.k_proj.bias", "gpt_neox.layers.1.attention.query_key_value.bias"));
  EXPECT_TRUE(has(spec, "layer_0.llama.mlp.up_proj.weight", "gpt_neox.layers.0.mlp.dense_h_to_4h.weight"));
  EXPECT_TRUE(has(spec, "norm.rms.bias", "gpt_neox.final_layer_norm.bias"));
  EXPECT_TRUE(has(spec, "lm_head.linear.weight", "embed_out.weight"));
  expect_read_in_place(dir, spec);
  // Older checkpoints' buffers (the causal mask, its fill, the rotary table) are not the model's.
  {
    models::SafetensorsCheckpoint ck(dir);
    models::NamedTensors all;
    for (const std::string& n : ck.names()) all.emplace_back(n, ck.get(n).clone());
    all.emplace_back("gpt_neox.layers.0.attention.bias", torch::ones({1, 1, 8, 8}, torch::kBool));
    all.emplace_back("gpt_neox.layers.0.attention.masked_bias", torch::tensor(-1e9));
    all.emplace_back("gpt_neox.layers.0.attention.rotary_emb.inv_freq", torch::ones({2}));
    const std::string old = root() + "/pythia-old";
    std::filesystem::create_directories(old);
    std::filesystem::copy_file(dir + "/config.json", old + "/config.json", std::filesystem::copy_options::overwrite_existing);
    models::save_safetensors_checkpoint(old, all, uint64_t{1} << 30, {{"format", "pt"}});
    EXPECT_EQ(test::hf_error(old), "(built)");
  }
  // One after the other, without attention biases; hidden_dropout the embeddings' and both branches'.
  std::ofstream(dir + "/config.json") << test::with(kPythia, {{"use_parallel_residual", false}, {"attention_bias", false}, {"hidden_dropout", 0.1},
                                                              {"attention_dropout", 0.05}}).dump();
  const nlohmann::json layers = models::read_hf_spec(dir, 8, "test").layers["layers"];
  EXPECT_EQ(layers[1]["type"], "dropout");
  EXPECT_EQ(layers[1]["p"], 0.1);
  EXPECT_FALSE(layers[2].contains("norms"));
  EXPECT_EQ(layers[2]["qkv_bias"], false);
  EXPECT_EQ(layers[2]["dropout"], 0.1);
  EXPECT_EQ(layers[2]["attn_dropout"], 0.05);
  // Refused by name.
  std::ofstream(dir + "/config.json") << test::with(kPythia, {{"num_key_value_heads", 1}}).dump();
  EXPECT_NE(test::hf_error(dir).find("num_key_value_heads must equal num_attention_heads"), std::string::npos) << test::hf_error(dir);
  std::ofstream(dir + "/config.json") << test::with(kPythia, {{"hidden_act", "relu"}}).dump();
  EXPECT_NE(test::hf_error(dir).find("hidden_act 'relu' is not supported (gelu, gelu_new, gelu_fast, gelu_pytorch_tanh)"), std::string::npos)
      << test::hf_error(dir);
  std::ofstream(dir + "/config.json") << test::with(kPythia, {{"rotary_pct", 0.1}}).dump();
  EXPECT_NE(test::hf_error(dir).find("partial_rotary_factor 0.1 turns 0 of a head's 8 values"), std::string::npos) << test::hf_error(dir);
  std::ofstream(dir + "/config.json") << test::with(kPythia, {{"head_dim", 4}}).dump();
  EXPECT_NE(test::hf_error(dir).find("head_dim is not supported apart from hidden_size / heads (8)"), std::string::npos) << test::hf_error(dir);
  std::ofstream(dir + "/config.json") << test::with(kPythia, {{"hidden_dropout", 1.0}}).dump();
  EXPECT_NE(test::hf_error(dir).find("hidden_dropout must be in [0, 0.99], got 1"), std::string::npos) << test::hf_error(dir);
}

TEST(HfFamily, PhiReadsPhi2sConfigHeadBiasDropoutsAndQkNorms) {
  const std::string dir = test::hf_write_model(root() + "/phi2", kPhi2);
  const models::HfSpec spec = models::read_hf_spec(dir, 8, "test");
  const nlohmann::json& b = spec.layers["layers"][1];
  EXPECT_EQ(b["norms"], "parallel");
  EXPECT_EQ(b["parallel_sum"], "branches_first");
  EXPECT_EQ(b["n_kv_heads"], 2);  // null: the heads
  EXPECT_EQ(b["partial_rotary_factor"], 0.4);
  EXPECT_EQ(b["act"], "gelu_new");
  EXPECT_EQ(b["dropout"], 0.1);
  EXPECT_EQ(b["attn_dropout"], 0.0);
  EXPECT_EQ(spec.layers["layers"].back()["bias"], true);  // the head's
  EXPECT_TRUE(has(spec, "lm_head.linear.bias", "lm_head.bias"));
  EXPECT_TRUE(has(spec, "layer_0.llama.self_attn.o_proj.bias", "model.layers.0.self_attn.dense.bias"));
  EXPECT_TRUE(has(spec, "layer_1.llama.mlp.down_proj.weight", "model.layers.1.mlp.fc2.weight"));
  EXPECT_TRUE(has(spec, "norm.rms.weight", "model.final_layernorm.weight"));
  expect_read_in_place(dir, spec);
  // Its embeddings' dropout a layer; its q/k LayerNorms (one weight and bias for every head).
  const std::string qk = test::hf_write_model(root() + "/phi-qk", test::with(kPhi2, {{"qk_layernorm", true}, {"embd_pdrop", 0.2}}));
  const models::HfSpec with_qk = models::read_hf_spec(qk, 8, "test");
  EXPECT_EQ(with_qk.layers["layers"][1]["type"], "dropout");
  EXPECT_EQ(with_qk.layers["layers"][2]["qk_norm_bias"], true);
  EXPECT_TRUE(has(with_qk, "layer_0.llama.self_attn.k_norm.bias", "model.layers.0.self_attn.k_layernorm.bias"));
  expect_read_in_place(qk, with_qk);
}

TEST(HfFamily, StableLmReadsPerHeadNormsAndRefusesTheMlpsOwnDropout) {
  const std::string dir = test::hf_write_model(root() + "/stablelm", kStableLm);
  const models::HfSpec spec = models::read_hf_spec(dir, 8, "test");
  const nlohmann::json& b = spec.layers["layers"][1];
  EXPECT_EQ(b["norms"], "parallel");
  EXPECT_FALSE(b.contains("parallel_sum"));  // residual + attention + MLP
  EXPECT_EQ(b["partial_rotary_factor"], 0.25);
  EXPECT_EQ(b["act"], "silu");
  EXPECT_EQ(b["qk_norm_over"], "each_head");
  EXPECT_FALSE(b.contains("qk_norm_bias"));
  // q_layernorm.norms.<head>.weight: a row of q_norm.weight each.
  EXPECT_TRUE(std::any_of(spec.tensors.begin(), spec.tensors.end(), [](const models::HfTensor& t) {
    return t.ours == "layer_1.llama.self_attn.k_norm.weight" && t.theirs == "model.layers.1.self_attn.k_layernorm.norms.1.weight" && t.ours_row == 1;
  }));
  EXPECT_FALSE(has(spec, "layer_0.llama.post_attention_layernorm.weight", "model.layers.0.post_attention_layernorm.weight"));
  expect_read_in_place(dir, spec);
  // Its default key heads (32) must divide the heads; the MLP's own dropout is refused.
  nlohmann::json no_kv = kStableLm;
  no_kv.erase("num_key_value_heads");
  std::ofstream(dir + "/config.json") << no_kv.dump();
  EXPECT_NE(test::hf_error(dir).find("num_key_value_heads (32, StableLmConfig's default) must divide num_attention_heads (4)"), std::string::npos)
      << test::hf_error(dir);
  std::ofstream(dir + "/config.json") << test::with(kStableLm, {{"hidden_dropout", 0.1}}).dump();
  EXPECT_NE(test::hf_error(dir).find("hidden_dropout above 0 is not supported (StableLM drops the MLP's output alone"), std::string::npos)
      << test::hf_error(dir);
}

// Falcon-7B's config as published, Falcon-40B's layout and what transformers' Falcon cannot run.
TEST(HfFamily, FalconReadsItsThreeLayoutsAndRefusesWhatItCannotRun) {
  const nlohmann::json falcon7b{{"architectures", {"FalconForCausalLM"}}, {"model_type", "falcon"}, {"vocab_size", 40}, {"hidden_size", 32},
                                {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"multi_query", true}, {"parallel_attn", true},
                                {"new_decoder_architecture", false}, {"alibi", false}, {"bias", false}, {"layer_norm_epsilon", 1e-4},
                                {"hidden_dropout", 0.0}, {"attention_dropout", 0.0}};
  const std::string dir = test::hf_write_model(root() + "/falcon7b", falcon7b);
  const models::HfSpec spec = models::read_hf_spec(dir, 8, "test");
  const nlohmann::json& b = spec.layers["layers"][1];
  EXPECT_EQ(b["n_kv_heads"], 1);
  EXPECT_EQ(b["kv_heads"], "broadcast");
  EXPECT_EQ(b["norms"], "parallel");
  EXPECT_EQ(b["parallel_sum"], "branches_first");
  EXPECT_EQ(b["d_ff"], 128);  // 4 · hidden_size
  EXPECT_EQ(b["act"], "gelu");
  EXPECT_EQ(b["eps"], 1e-4);
  EXPECT_FALSE(b.contains("partial_rotary_factor"));
  EXPECT_FALSE(b.contains("bias_apart"));
  EXPECT_TRUE(spec.tied);
  EXPECT_TRUE(has(spec, "layer_1.llama.self_attn.v_proj.weight", "transformer.h.1.self_attention.query_key_value.weight"));
  EXPECT_TRUE(has(spec, "norm.rms.bias", "transformer.ln_f.bias"));
  expect_read_in_place(dir, spec);
  // Falcon-40B's: a key head's group of queries, its key and value; ln_attn and ln_mlp; biases apart.
  const nlohmann::json falcon40b = test::with(falcon7b, {{"new_decoder_architecture", true}, {"num_kv_heads", 2}, {"bias", true}, {"ffn_hidden_size", 24}});
  const std::string fresh = test::hf_write_model(root() + "/falcon40b", falcon40b);
  const models::HfSpec grouped = models::read_hf_spec(fresh, 8, "test");
  EXPECT_EQ(grouped.layers["layers"][1]["n_kv_heads"], 2);
  EXPECT_EQ(grouped.layers["layers"][1]["kv_heads"], "repeated");
  EXPECT_EQ(grouped.layers["layers"][1]["norms"], "parallel_two");
  EXPECT_EQ(grouped.layers["layers"][1]["bias_apart"], true);
  EXPECT_TRUE(has(grouped, "layer_0.llama.post_attention_layernorm.bias", "transformer.h.0.ln_mlp.bias"));
  expect_read_in_place(fresh, grouped);
  // One after the other, each head's query, key and value in turn.
  const std::string seq = test::hf_write_model(root() + "/falcon-seq", test::with(falcon7b, {{"multi_query", false}, {"parallel_attn", false}}));
  const models::HfSpec sequential = models::read_hf_spec(seq, 8, "test");
  EXPECT_FALSE(sequential.layers["layers"][1].contains("norms"));
  EXPECT_EQ(sequential.layers["layers"][1]["n_kv_heads"], 4);
  expect_read_in_place(seq, sequential);
  // Refused by name.
  const std::pair<nlohmann::json, std::string> refused[] = {
      {{{"alibi", true}}, "alibi true is not supported (ALiBi positions"},
      {{{"hidden_dropout", 0.1}}, "hidden_dropout above 0 is not supported"},
      {{{"parallel_attn", false}, {"attention_dropout", 0.1}}, "attention_dropout above 0 is not supported with parallel_attn false"},
      {{{"new_decoder_architecture", true}, {"parallel_attn", false}}, "parallel_attn false is not supported with new_decoder_architecture"},
      {{{"num_ln_in_parallel_attn", 2}}, "num_ln_in_parallel_attn 2 needs new_decoder_architecture"},
      {{{"activation", "relu"}}, "activation 'relu' is not supported"},
  };
  for (const auto& [change, message] : refused) {
    std::ofstream(dir + "/config.json") << test::with(falcon7b, change).dump();
    EXPECT_NE(test::hf_error(dir).find(message), std::string::npos) << test::hf_error(dir);
  }
  // attention_dropout beside parallel attention: unused by transformers' Falcon with rotary positions, read as such.
  std::ofstream(dir + "/config.json") << test::with(falcon7b, {{"attention_dropout", 0.1}}).dump();
  EXPECT_FALSE(models::read_hf_spec(dir, 8, "test").layers["layers"][1].contains("attn_dropout"));
}

// GPT-J's config as published (n_embd, n_head, rotary_dim 64 of heads of 256, here 4 of 8).
TEST(HfFamily, GptJReadsItsInterleavedPartialRotationAndRefusals) {
  const nlohmann::json gptj{{"architectures", {"GPTJForCausalLM"}}, {"model_type", "gptj"}, {"vocab_size", 40}, {"n_embd", 32},
                            {"n_layer", 2}, {"n_head", 4}, {"rotary_dim", 4}, {"n_positions", 16}, {"n_inner", nullptr},
                            {"activation_function", "gelu_new"}, {"resid_pdrop", 0.1}, {"embd_pdrop", 0.0}, {"attn_pdrop", 0.0}};
  const std::string dir = test::hf_write_model(root() + "/gptj", gptj);
  const models::HfSpec spec = models::read_hf_spec(dir, 8, "test");
  const nlohmann::json& b = spec.layers["layers"][1];
  EXPECT_EQ(b["norms"], "parallel");
  EXPECT_EQ(b["parallel_sum"], "branches_first");
  EXPECT_EQ(b["partial_rotary_factor"], 0.5);
  EXPECT_EQ(b["rope_interleave"], true);
  EXPECT_EQ(b["rope_pairs_kept"], true);
  EXPECT_EQ(b["d_ff"], 128);  // n_inner null: 4 · n_embd
  EXPECT_EQ(b["dropout"], 0.1);
  EXPECT_EQ(b["qkv_bias"], false);
  EXPECT_EQ(b["mlp_bias"], true);
  EXPECT_TRUE(has(spec, "lm_head.linear.bias", "lm_head.bias"));
  EXPECT_TRUE(has(spec, "layer_0.llama.self_attn.o_proj.weight", "transformer.h.0.attn.out_proj.weight"));
  expect_read_in_place(dir, spec);
  std::ofstream(dir + "/config.json") << test::with(gptj, {{"rotary_dim", nullptr}}).dump();
  EXPECT_NE(test::hf_error(dir).find("rotary_dim null is not supported"), std::string::npos) << test::hf_error(dir);
  std::ofstream(dir + "/config.json") << test::with(gptj, {{"rotary_dim", 3}}).dump();
  EXPECT_NE(test::hf_error(dir).find("rotary_dim 3 must be even"), std::string::npos) << test::hf_error(dir);
  std::ofstream(dir + "/config.json") << gptj.dump();
  EXPECT_NE(test::hf_error(dir, 32).find("n_positions 16 is shorter than the sequence (32"), std::string::npos) << test::hf_error(dir, 32);
}

// GPT-BigCode's config as StarCoder publishes it (multi_query, its dropouts of 0.1), c_attn's parts.
TEST(HfFamily, GptBigCodeReadsOneKeyHeadLearnedPositionsAndDropouts) {
  const nlohmann::json bigcode{{"architectures", {"GPTBigCodeForCausalLM"}}, {"model_type", "gpt_bigcode"}, {"vocab_size", 40},
                               {"n_embd", 32}, {"n_layer", 2}, {"n_head", 4}, {"n_inner", 48}, {"n_positions", 16}, {"multi_query", true},
                               {"activation_function", "gelu_pytorch_tanh"}, {"resid_pdrop", 0.1}, {"embd_pdrop", 0.1}, {"attn_pdrop", 0.1},
                               {"scale_attn_weights", true}};
  const std::string dir = test::hf_write_model(root() + "/bigcode", bigcode);
  const models::HfSpec spec = models::read_hf_spec(dir, 8, "test");
  const nlohmann::json& e = spec.layers["layers"][0];
  EXPECT_EQ(e["max_positions"], 16);
  EXPECT_EQ(e["dropout"], 0.1);
  const nlohmann::json& b = spec.layers["layers"][1];
  EXPECT_EQ(b["n_kv_heads"], 1);
  EXPECT_EQ(b["rotary"], false);
  EXPECT_EQ(b["act"], "gelu_tanh");
  EXPECT_EQ(b["dropout"], 0.1);
  EXPECT_EQ(b["attn_dropout"], 0.1);
  EXPECT_FALSE(b.contains("attn_scale"));
  EXPECT_TRUE(spec.tied);
  EXPECT_TRUE(has(spec, "layer_1.llama.self_attn.k_proj.bias", "transformer.h.1.attn.c_attn.bias"));
  EXPECT_TRUE(has(spec, "embed.embedding.pos.weight", "transformer.wpe.weight"));
  expect_read_in_place(dir, spec);
  // The head tied to the token embedding (beside the positions) when built.
  models::Model m = test::hf_build(dir, 8);
  auto params = m.layers->named_parameters();
  EXPECT_TRUE(torch::equal(params["lm_head.linear.weight"], params["embed.embedding.tok.weight"]));
  std::ofstream(dir + "/config.json") << test::with(bigcode, {{"scale_attn_weights", false}}).dump();
  EXPECT_EQ(models::read_hf_spec(dir, 8, "test").layers["layers"][1]["attn_scale"], 1.0);
  std::ofstream(dir + "/config.json") << test::with(bigcode, {{"add_cross_attention", true}}).dump();
  EXPECT_NE(test::hf_error(dir).find("add_cross_attention true is not supported"), std::string::npos) << test::hf_error(dir);
  std::ofstream(dir + "/config.json") << bigcode.dump();
  EXPECT_NE(test::hf_error(dir, 32).find("n_positions is 16, fewer than model.seq_len (32)"), std::string::npos) << test::hf_error(dir, 32);
}

// OLMo (the first): Llama's layers with LayerNorms without parameters (no tensors), clip_qkv, its
// padding token 1 by default; the rmsnorm without a weight is torch's parameterless LayerNorm.
TEST(HfFamily, OlmoReadsNormsWithoutParametersAndClippedQkv) {
  const nlohmann::json olmo{{"architectures", {"OlmoForCausalLM"}}, {"model_type", "olmo"}, {"vocab_size", 40}, {"hidden_size", 16},
                            {"intermediate_size", 24}, {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"clip_qkv", 8.0}};
  const std::string dir = test::hf_write_model(root() + "/olmo", olmo);
  const models::HfSpec spec = models::read_hf_spec(dir, 8, "test");
  const nlohmann::json& b = spec.layers["layers"][1];
  EXPECT_EQ(b["norm_scale"], "none");
  EXPECT_EQ(b["norm_center"], true);
  EXPECT_EQ(b["clip_qkv"], 8.0);
  EXPECT_EQ(b["rope_float32"], true);
  EXPECT_EQ(spec.layers["layers"][0]["padding_idx"], 1);
  EXPECT_FALSE(std::any_of(spec.tensors.begin(), spec.tensors.end(), [](const models::HfTensor& t) { return t.theirs.find("norm") != std::string::npos; }));
  models::Model m = test::hf_build(dir, 8);
  for (const auto& p : m.layers->named_parameters()) EXPECT_EQ(p.key().find("norm"), std::string::npos) << p.key();
  expect_read_in_place(dir, spec);
  std::ofstream(dir + "/config.json") << test::with(olmo, {{"clip_qkv", -1.0}}).dump();
  EXPECT_NE(test::hf_error(dir).find("clip_qkv must be above 0, got -1"), std::string::npos) << test::hf_error(dir);
  // The layer: torch's layer_norm without parameters, in float32 for bfloat16.
  const nlohmann::json list{{"family", "layers"}, {"input_shape", {6}},
                            {"layers", {{{"name", "n"}, {"type", "rmsnorm"}, {"normalized_shape", 6}, {"eps", 1e-5}, {"center", true}, {"scale", "none"}}}}};
  models::Model norm = test::build_model_section(list, 1);
  EXPECT_TRUE(norm.layers->named_parameters().is_empty());
  const at::Tensor x = torch::randn({3, 6}).to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(norm.layers->forward(x), at::layer_norm(x.to(torch::kFloat), {6}, {}, {}, 1e-5).to(torch::kBFloat16)));
  nlohmann::json uncentered = list;
  uncentered["layers"][0]["center"] = false;
  EXPECT_NE(test::build_error(uncentered).find("scale: \"none\" needs center true"), std::string::npos) << test::build_error(uncentered);
}
