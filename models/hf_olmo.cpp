// OLMo (the first: OLMo-1B, 7B; the `hf` family, models/hf_fields.h): Llama's layer with LayerNorms
// without parameters (computed in float32 for lower precisions, eps 1e-5), q, k and v clamped by
// clip_qkv, the rotation in float32, biases on the projections by attention_bias and padding token 1 by default, as
// transformers' OlmoForCausalLM computes it. Read as Llama's layers, then given its norms.
#include <string>
#include <vector>

#include "models/hf_fields.h"

namespace pipetrain::models::hf_detail {

void olmo(const Fields& f, const nlohmann::json& config, int64_t seq_len, HfSpec& spec) {
  nlohmann::json llama = config;  // what Llama's reader takes
  llama["rms_norm_eps"] = 1e-5;   // OlmoLayerNorm's, fixed
  llama.erase("clip_qkv");
  if (!f.has("pad_token_id") && !f.at_null("pad_token_id")) llama["pad_token_id"] = 1;  // OlmoConfig's default
  double clip = 0;
  if (f.has("clip_qkv")) {
    clip = f.number("clip_qkv", 0.0);
    if (!(clip > 0)) f.fail("clip_qkv", detail::concat("must be above 0, got ", clip));
  }
  llama_family(kLlama, Fields(llama, f.where()), seq_len, spec);
  for (nlohmann::json& layer : spec.layers["layers"]) {
    if (layer["type"] == "llama_block") {
      layer["norm_center"] = true;
      layer["norm_scale"] = "none";
      layer["rope_float32"] = true;  // its tables in float32, the rotation in float32, then the cast (OLMo 2's too)
      if (clip > 0) layer["clip_qkv"] = clip;
    } else if (layer["name"] == "norm") {
      layer["center"] = true;
      layer["scale"] = "none";
    }
  }
  std::vector<HfTensor> tensors;  // the norms have no tensors
  for (const HfTensor& t : spec.tensors) {
    const bool norm = t.ours == "norm.rms.weight" ||
                      (t.ours.size() > 16 && t.ours.compare(t.ours.size() - 16, 16, "layernorm.weight") == 0);
    if (!norm) tensors.push_back(t);
  }
  spec.tensors = tensors;
}

}  // namespace pipetrain::models::hf_detail
