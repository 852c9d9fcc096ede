// Cohere's Command R, R+ and Aya (the `hf` family, models/hf_fields.h): Llama's layer with one norm
// feeding attention and the MLP side by side, LayerNorms without a bias, the rotation of
// interleaved pairs, and the logits scaled, as transformers' CohereForCausalLM computes them.
#include <string>

#include "models/hf_fields.h"

namespace pipetrain::models::hf_detail {

void cohere_args(const Fields& f, const std::string& arch, nlohmann::json& block) {
  block["norms"] = "parallel";
  block["norm_center"] = true;           // CohereLayerNorm: the mean subtracted, no bias
  block["norm_scale"] = "before_cast";   // its weight multiplies in float32, then the cast
  block["eps"] = f.number("layer_norm_eps", 1e-5);
  block["rope_interleave"] = block["rope_pairs_kept"] = true;  // its rotary tables repeat each angle for a pair
  block["rope_float32"] = block["rope_tables_rounded"] = true;  // the tables in the model's type, the products in float32
  // Command R+'s LayerNorms (centered, without a bias) of each head's queries and keys before the
  // rotation, each head with its own weight; Cohere 2 has none.
  if (arch == kCohere && f.boolean("use_qk_norm", false)) {
    block["qk_norm"] = true;
    block["qk_norm_over"] = "each_head";
  }
}

void cohere_logit_scale(const Fields& f, HfSpec& spec) {
  const double s = f.number("logit_scale", 0.0625);
  if (s == 0) f.fail("logit_scale", "must not be 0");
  if (s != 1.0) spec.layers["layers"].push_back({{"name", "logit_scale"}, {"type", "scale"}, {"by", s}});
}

}  // namespace pipetrain::models::hf_detail
