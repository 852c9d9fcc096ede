// ByteDance's Seed-OSS (the `hf` family, models/hf_fields.h): Llama's layer with biases on q, k and
// v by attention_bias (true by default), on o by attention_out_bias, heads of 128 and a padding
// token (1) by default, and its dropouts (0.1 by default, as published), as transformers'
// SeedOssForCausalLM computes it. Read as Llama's layers, then given its biases and dropouts.
#include <string>
#include <vector>

#include "models/hf_fields.h"

namespace pipetrain::models::hf_detail {

void seed_oss(const Fields& f, const nlohmann::json& config, int64_t seq_len, HfSpec& spec) {
  auto p = [&](const char* k) {
    const double v = f.number(k, 0.1);
    if (v < 0 || v > 0.99) f.fail(k, detail::concat("must be in [0, 0.99], got ", v));
    return v;
  };
  const double residual = p("residual_dropout"), attention = p("attention_dropout");
  const bool qkv = f.boolean("attention_bias", true), o = f.boolean("attention_out_bias", false);
  nlohmann::json llama = config;  // what Llama's reader takes: no attention biases (given below), no dropout
  llama["attention_bias"] = false;
  llama.erase("attention_dropout");
  if (!f.has("head_dim")) llama["head_dim"] = 128;  // SeedOssConfig's defaults
  if (!f.has("num_key_value_heads")) llama["num_key_value_heads"] = 8;
  if (!f.has("pad_token_id") && !f.at_null("pad_token_id")) llama["pad_token_id"] = 1;
  llama_family(kLlama, Fields(llama, f.where()), seq_len, spec);
  for (nlohmann::json& layer : spec.layers["layers"])
    if (layer["type"] == "llama_block") {
      layer["qkv_bias"] = qkv;
      layer["o_bias"] = o;
      if (residual > 0 || attention > 0) {  // keyed masks, not torch's (training alone)
        layer["dropout"] = residual;
        layer["attn_dropout"] = attention;
      }
    }
  std::vector<HfTensor> tensors;
  for (const HfTensor& t : spec.tensors) {
    tensors.push_back(t);
    for (const char* p : {"q", "k", "v", "o"}) {
      const std::string weight = detail::concat("self_attn.", p, "_proj.weight");
      if ((std::string(p) == "o" ? o : qkv) && t.ours.size() > weight.size() &&
          t.ours.compare(t.ours.size() - weight.size(), weight.size(), weight) == 0) {
        const auto bias = [](const std::string& w) { return w.substr(0, w.size() - 6) + "bias"; };
        tensors.push_back({bias(t.ours), bias(t.theirs)});
      }
    }
  }
  spec.tensors = tensors;
}

}  // namespace pipetrain::models::hf_detail
