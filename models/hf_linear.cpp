// Qwen3-Next's and Qwen3.5's gated DeltaNet layers (the `hf` family, models/hf_fields.h): which
// layers hold one, their arguments and their tensors, as transformers' configs and checkpoints name them.
#include <string>
#include <vector>

#include "models/hf_fields.h"

namespace pipetrain::models::hf_detail {

LinearLayers read_linear_layers(const std::string& arch, const Fields& f, int64_t n) {
  LinearLayers x;
  x.layers.assign(static_cast<size_t>(n), false);
  if (!qwen_hybrid(arch)) return x;
  if (f.has("layer_types")) {
    const nlohmann::json& types = f.at("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != n) f.fail("layer_types", detail::concat("must list ", n, " layers"));
    for (int64_t i = 0; i < n; ++i) {
      const nlohmann::json& t = types[static_cast<size_t>(i)];
      if (t != "linear_attention" && t != "full_attention")
        f.fail("layer_types", "'" + t.dump() + "' is not supported (linear_attention, full_attention)");
      x.layers[static_cast<size_t>(i)] = t == "linear_attention";
    }
  } else {
    for (int64_t i = 0; i < n; ++i) x.layers[static_cast<size_t>(i)] = (i + 1) % 4 != 0;  // transformers' default
  }
  const int64_t big = int64_t{1} << 20;
  const int64_t key_heads = f.integer("linear_num_key_heads", 16, 1, big), value_heads = f.integer("linear_num_value_heads", 32, 1, big);
  if (value_heads % key_heads) f.fail("linear_num_value_heads", detail::concat("must be a multiple of linear_num_key_heads (", key_heads, ")"));
  x.args = {{"linear_key_heads", key_heads}, {"linear_value_heads", value_heads},
            {"linear_key_head_dim", f.integer("linear_key_head_dim", 128, 1, big)},
            {"linear_value_head_dim", f.integer("linear_value_head_dim", 128, 1, big)},
            {"linear_conv_kernel", f.integer("linear_conv_kernel_dim", 4, 1, 1024)}};
  if (arch != kQwen3Next) x.args["linear_projections"] = "split";  // Qwen3.5's
  return x;
}

void linear_attention_tensors(const std::string& arch, const std::string& ours, const std::string& theirs, HfSpec& spec) {
  std::vector<std::string> names{"conv1d.weight", "dt_bias", "A_log", "norm.weight", "out_proj.weight"};
  if (arch == kQwen3Next) names.insert(names.begin(), {"in_proj_qkvz.weight", "in_proj_ba.weight"});
  else names.insert(names.begin(), {"in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight"});
  for (const std::string& p : names) spec.tensors.push_back({ours + "linear_attn." + p, theirs + "linear_attn." + p});
}

}  // namespace pipetrain::models::hf_detail
