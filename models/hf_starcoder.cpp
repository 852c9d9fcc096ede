// StarCoder2 (the `hf` family, models/hf_fields.h): Mistral's layer with LayerNorms (a weight and
// a bias) in RMSNorm's place, an MLP without a gate through the tanh GELU (c_fc, c_proj), biases on
// every projection by use_bias, its dropouts (as published: 0.1), and a tied head by default, as
// transformers' Starcoder2ForCausalLM computes it. Read as Mistral's layers (its windows and rope),
// then given its norms, MLP, biases, dropouts and names.
#include <string>
#include <vector>

#include "models/hf_fields.h"

namespace pipetrain::models::hf_detail {

void starcoder2(const Fields& f, const nlohmann::json& config, int64_t seq_len, HfSpec& spec) {
  const std::string act = f.string("hidden_act", "gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh") f.fail("hidden_act", "'" + act + "' is not supported (gelu_pytorch_tanh)");
  auto p = [&](const char* k) {
    const double v = f.number(k, 0.0);
    if (v < 0 || v > 0.99) f.fail(k, detail::concat("must be in [0, 0.99], got ", v));
    return v;
  };
  const double residual = p("residual_dropout"), attention = p("attention_dropout"), embedding = p("embedding_dropout");
  const bool bias = f.boolean("use_bias", true);
  nlohmann::json mistral = config;  // what Mistral's reader takes: its norms' eps, SwiGLU's name, no dropout
  mistral["rms_norm_eps"] = f.number("norm_epsilon", 1e-5);
  mistral["hidden_act"] = "silu";
  mistral.erase("attention_dropout");
  mistral["tie_word_embeddings"] = f.boolean("tie_word_embeddings", true);
  if (!f.has("num_key_value_heads")) mistral["num_key_value_heads"] = 2;  // Starcoder2Config's default
  llama_family(kMistral, Fields(mistral, f.where()), seq_len, spec);
  for (nlohmann::json& layer : spec.layers["layers"]) {
    if (layer["type"] == "llama_block") {
      layer["norm_center"] = layer["norm_bias"] = true;
      layer["act"] = "gelu_tanh";
      layer["mlp_gate"] = false;
      layer["qkv_bias"] = layer["o_bias"] = layer["mlp_bias"] = bias;
      if (residual > 0 || attention > 0) {  // keyed masks, not torch's (training alone)
        layer["dropout"] = residual;
        layer["attn_dropout"] = attention;
      }
    } else if (layer["name"] == "norm") {
      layer["center"] = layer["bias"] = true;
    }
  }
  std::vector<HfTensor> tensors;
  for (const HfTensor& t : spec.tensors) {
    const auto ends = [&](const std::string& s) { return t.ours.size() >= s.size() && t.ours.compare(t.ours.size() - s.size(), s.size(), s) == 0; };
    const std::string stem = t.theirs.substr(0, t.theirs.rfind(".weight"));
    if (ends("mlp.gate_proj.weight")) continue;
    const std::string ours = t.ours.substr(0, t.ours.rfind(".weight"));
    std::string theirs = stem;
    if (ends("mlp.up_proj.weight")) theirs = stem.substr(0, stem.rfind("up_proj")) + "c_fc";
    if (ends("mlp.down_proj.weight")) theirs = stem.substr(0, stem.rfind("down_proj")) + "c_proj";
    tensors.push_back({t.ours, theirs + ".weight"});
    const bool norm = ends("layernorm.weight") || t.ours == "norm.rms.weight";
    const bool projection = ends("_proj.weight");
    if (norm || (bias && projection)) tensors.push_back({ours + ".bias", theirs + ".bias"});
  }
  spec.tensors = tensors;
  if (embedding > 0) {  // the embeddings' dropout: a layer after embed
    nlohmann::json& layers = spec.layers["layers"];
    layers.insert(layers.begin() + 1, nlohmann::json{{"name", "embed_dropout"}, {"type", "dropout"}, {"p", embedding}});
  }
}

}  // namespace pipetrain::models::hf_detail
