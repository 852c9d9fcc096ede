// NVIDIA's Nemotron-H (the `hf` family, models/hf_fields.h): a chain of blocks of one part each
// (Mamba 2, attention without positions, a relu² MLP, or a mixture of relu² experts), each
// norm → part → residual, as transformers' NemotronHForCausalLM computes it and its checkpoints
// name it (under backbone.).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "models/hf_fields.h"

namespace pipetrain::models::hf_detail {

namespace {

using json = nlohmann::json;

// Each block's part: layers_block_type (its new names and the old ones), or the older
// hybrid_override_pattern ("M" Mamba, "*" attention, "-" MLP, "E" experts).
std::vector<std::string> block_types(const Fields& f) {
  std::vector<std::string> types;
  if (f.has("layers_block_type") || f.has("layer_types")) {
    const std::string key = f.has("layers_block_type") ? "layers_block_type" : "layer_types";
    const json& list = f.at(key);
    if (!list.is_array() || list.empty()) f.fail(key, "must list the blocks' types");
    for (const json& t : list) {
      const std::string s = t.is_string() ? t.get<std::string>() : "";
      if (s == "mamba" || s == "linear_attention") types.push_back("mamba");
      else if (s == "attention" || s == "full_attention") types.push_back("attention");
      else if (s == "mlp" || s == "moe") types.push_back(s);
      else f.fail(key, "'" + t.dump() + "' is not supported (mamba, attention, mlp, moe; linear_attention, full_attention)");
    }
  } else if (f.has("hybrid_override_pattern")) {
    const std::string pattern = f.string("hybrid_override_pattern", "");
    for (char c : pattern) {
      if (c == 'M') types.push_back("mamba");
      else if (c == '*') types.push_back("attention");
      else if (c == '-') types.push_back("mlp");
      else if (c == 'E') types.push_back("moe");
      else f.fail("hybrid_override_pattern", detail::concat("holds '", std::string(1, c), "', not M, *, - or E"));
    }
    if (types.empty()) f.fail("hybrid_override_pattern", "must name the blocks");
  } else {
    types = {"mamba", "moe", "attention", "mlp"};  // transformers' default
  }
  if (f.has("num_hidden_layers") && !f.at_null("num_hidden_layers") &&
      f.integer("num_hidden_layers", 0, 1, 4096) != static_cast<int64_t>(types.size()))
    f.fail("num_hidden_layers", detail::concat("must equal the ", types.size(), " blocks the types name"));
  return types;
}

// An integer under its name or its older one.
int64_t either(const Fields& f, const std::string& key, const std::string& old, int64_t def, int64_t max) {
  return f.has(key) || !f.has(old) ? f.integer(key, def, 1, max) : f.integer(old, def, 1, max);
}

}  // namespace

void nemotron_h(const Fields& f, int64_t seq_len, HfSpec& spec) {
  const int64_t big = int64_t{1} << 30;
  const int64_t vocab = f.integer("vocab_size", 0, 1, big, true), d = f.integer("hidden_size", 0, 1, big, true);
  const std::vector<std::string> types = block_types(f);
  for (const char* k : {"attention_dropout", "hidden_dropout"})
    if (f.number(k, 0.0) != 0.0) f.fail(k, "above 0 is not supported (set it to 0.0)");
  if (!f.at_null("sliding_window") && f.integer("sliding_window", 0, 0, big) > 0) f.fail("sliding_window", "is not supported (null)");
  if (f.string("mlp_hidden_act", "relu2") != "relu2") f.fail("mlp_hidden_act", "'" + f.string("mlp_hidden_act", "") + "' is not supported (relu2)");
  if (f.string("mamba_hidden_act", "silu") != "silu") f.fail("mamba_hidden_act", "'" + f.string("mamba_hidden_act", "") + "' is not supported (silu)");
  if (f.integer("num_nextn_predict_layers", 0, 0, 64) > 0) f.fail("num_nextn_predict_layers", "above 0 is not supported (multi-token prediction)");
  const bool bias = f.boolean("attention_bias", false), mlp_bias = f.boolean("mlp_bias", false);
  const int64_t heads = f.integer("num_attention_heads", 32, 1, 1 << 16);
  json base{{"type", "llama_block"}, {"d_model", d}, {"n_heads", heads}, {"n_kv_heads", f.integer("num_key_value_heads", 8, 1, heads)},
            {"head_dim", f.integer("head_dim", 128, 2, 1 << 16)}, {"eps", f.number("layer_norm_epsilon", 1e-5)}, {"rotary", false},
            {"norm_scale", "before_cast"},  // its norms' weight multiplies in float32, then the cast
            {"qkv_bias", bias}, {"o_bias", bias}, {"mlp_bias", mlp_bias}, {"act", "relu2"}, {"mlp_gate", false},
            {"d_ff", f.integer("intermediate_size", 21504, 1, big)}};
  if (heads % base["n_kv_heads"].get<int64_t>()) f.fail("num_key_value_heads", detail::concat("must divide num_attention_heads (", heads, ")"));
  // Mamba 2: its steps clamped below by time_step_min (transformers' mixer reads it, not time_step_limit).
  const int64_t m_heads = f.integer("mamba_num_heads", 128, 1, big), groups = either(f, "n_groups", "mamba_n_groups", 8, big);
  if (m_heads % groups) f.fail("n_groups", detail::concat("must divide mamba_num_heads (", m_heads, ")"));
  const json mamba{{"mamba_heads", m_heads}, {"mamba_head_dim", f.integer("mamba_head_dim", 64, 1, big)},
                   {"mamba_state", f.integer("ssm_state_size", 128, 1, big)}, {"mamba_groups", groups},
                   {"mamba_conv_kernel", either(f, "conv_kernel", "mamba_d_conv", 4, 1024)},
                   {"mamba_chunk", either(f, "chunk_size", "mamba_chunk_size", 128, big)},
                   {"mamba_conv_bias", f.has("use_conv_bias") || !f.has("mamba_conv_bias") ? f.boolean("use_conv_bias", true) : f.boolean("mamba_conv_bias", true)},
                   {"mamba_proj_bias", f.boolean("use_bias", false)},
                   {"mamba_dt_min", f.has("time_step_min") || !f.has("mamba_dt_min") ? f.number("time_step_min", 0.001) : f.number("mamba_dt_min", 0.001)}};
  if (!(mamba["mamba_dt_min"].get<double>() >= 0)) f.fail("time_step_min", "must be at least 0");
  // The experts: DeepSeek-V3's sigmoid routing (its groups, correction bias, scaling) over relu² experts, a shared relu² expert.
  const int64_t count = f.integer("n_routed_experts", 8, 1, 1 << 16);
  const int64_t expert_groups = f.integer("n_group", 1, 1, count);
  if (count % expert_groups) f.fail("n_group", detail::concat("must divide n_routed_experts (", count, ")"));
  const json experts{{"experts", count}, {"experts_per_token", f.integer("num_experts_per_tok", 2, 1, count)}, {"router", "sigmoid"},
                     {"router_bias", true}, {"router_float32", true}, {"router_cast", false}, {"experts_sum_float32", true},
                     {"normalize_experts", f.boolean("norm_topk_prob", true)}, {"routed_scale", f.number("routed_scaling_factor", 1.0)},
                     {"expert_groups", expert_groups}, {"groups_per_token", f.integer("topk_group", 1, 1, expert_groups)},
                     {"d_ff", f.integer("moe_intermediate_size", 7688, 1, big)},
                     {"shared_expert", f.integer("moe_shared_expert_intermediate_size", 7688, 1, big)}, {"shared_expert_gate", false}};
  const int64_t latent = f.has("moe_latent_size") && !f.at_null("moe_latent_size") ? f.integer("moe_latent_size", 0, 1, big) : 0;
  json layers = json::array({{{"name", "embed"}, {"type", "embedding"}, {"num_embeddings", vocab}, {"embedding_dim", d}}});
  spec.tensors.push_back({"embed.embedding.weight", "backbone.embeddings.weight"});
  for (size_t i = 0; i < types.size(); ++i) {
    json b = base;
    b["name"] = detail::concat("layer_", i);
    const std::string ours = detail::concat("layer_", i, ".llama."), theirs = detail::concat("backbone.layers.", i, ".");
    const std::string& type = types[i];
    const bool mixer = type == "mamba" || type == "attention";
    if (mixer) b["mlp"] = false;
    else b["mixer"] = false;
    spec.tensors.push_back({ours + (mixer ? "input_layernorm.weight" : "post_attention_layernorm.weight"), theirs + "norm.weight"});
    std::vector<std::pair<std::string, std::string>> names;  // ours, theirs (under the block)
    if (type == "mamba") {
      b.update(mamba);
      for (const std::string& p : mamba_tensor_names(mamba)) names.push_back({"mamba." + p, p});
    } else if (type == "attention") {
      for (const char* p : {"q", "k", "v", "o"}) {
        names.push_back({detail::concat("self_attn.", p, "_proj.weight"), detail::concat(p, "_proj.weight")});
        if (bias) names.push_back({detail::concat("self_attn.", p, "_proj.bias"), detail::concat(p, "_proj.bias")});
      }
    } else if (type == "mlp") {
      for (const char* p : {"up_proj", "down_proj"})
        for (const char* kind : {"weight", "bias"})
          if (kind == std::string("weight") || mlp_bias) names.push_back({detail::concat("mlp.", p, ".", kind), detail::concat(p, ".", kind)});
    } else {
      b.update(experts);
      names = {{"mlp.gate.weight", "gate.weight"}, {"mlp.gate.e_score_correction_bias", "gate.e_score_correction_bias"}};
      if (latent > 0) {  // the experts on a latent: into it and out of it
        b["experts_latent"] = latent;
        names.insert(names.end(), {{"mlp.fc1_latent_proj.weight", "fc1_latent_proj.weight"}, {"mlp.fc2_latent_proj.weight", "fc2_latent_proj.weight"}});
      }
      for (int64_t e = 0; e < count; ++e)
        for (const char* p : {"up_proj", "down_proj"})
          names.push_back({detail::concat("mlp.experts.", e, ".", p, ".weight"), detail::concat("experts.", e, ".", p, ".weight")});
      for (const char* p : {"up_proj", "down_proj"})
        names.push_back({detail::concat("mlp.shared_expert.", p, ".weight"), detail::concat("shared_experts.", p, ".weight")});
      if (mlp_bias) f.fail("mlp_bias", "true is not supported with experts");
    }
    for (const auto& [mine, theirs_name] : names) spec.tensors.push_back({ours + mine, theirs + "mixer." + theirs_name});
    layers.push_back(b);
  }
  layers.push_back({{"name", "norm"}, {"type", "rmsnorm"}, {"normalized_shape", d}, {"eps", base["eps"]}, {"scale", "before_cast"}});
  spec.tensors.push_back({"norm.rms.weight", "backbone.norm_f.weight"});
  // transformers does not tie Nemotron-H's head (its _tied_weights_keys is empty): a checkpoint
  // saying so would be read otherwise than transformers reads it.
  if (f.boolean("tie_word_embeddings", false))
    f.fail("tie_word_embeddings", "true is not supported for NemotronHForCausalLM (transformers does not tie its head; set it false)");
  with_head(spec, layers, d, vocab, seq_len, false, "embed.embedding.weight");
}

}  // namespace pipetrain::models::hf_detail
