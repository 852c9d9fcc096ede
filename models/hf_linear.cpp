// Qwen3-Next's and Qwen3.5's gated DeltaNet layers and Granite 4.0-H's and Bamba's Mamba 2 layers
// (the `hf` family, models/hf_fields.h): which layers hold one, their arguments and their tensors,
// as transformers' configs and checkpoints name them.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "models/hf_fields.h"

namespace pipetrain::models::hf_detail {

namespace {

// time_step_limit's bound `i` ([min, max]): a number, or Infinity as transformers writes it
// ({"__float__": "Infinity"}); `fallback` where the field is absent or null.
double step_limit(const Fields& f, size_t i, double fallback) {
  if (!f.has("time_step_limit") || f.at_null("time_step_limit")) return fallback;
  const nlohmann::json& l = f.at("time_step_limit");
  if (!l.is_array() || l.size() != 2) f.fail("time_step_limit", "must be [min, max], got " + l.dump());
  const nlohmann::json& v = l[i];
  if (v.is_number()) return v.get<double>();
  if (v.is_object() && v.value("__float__", "") == "Infinity") return std::numeric_limits<double>::infinity();
  f.fail("time_step_limit", "must hold numbers (or Infinity), got " + v.dump());
  return fallback;
}

// Granite 4.0-H's and Bamba's Mamba 2 layers and their arguments.
LinearLayers mamba_layers(const std::string& arch, const Fields& f, int64_t n) {
  LinearLayers x;
  x.layers.assign(static_cast<size_t>(n), true);  // transformers' default: every layer
  if (arch == kBamba && f.has("attn_layer_indices")) {  // Bamba's attention layers; Mamba 2 in the others
    const nlohmann::json& list = f.at("attn_layer_indices");
    if (!list.is_array()) f.fail("attn_layer_indices", "must list layer indices, got " + list.dump());
    for (const nlohmann::json& i : list) {
      if (!i.is_number_integer() || i.get<int64_t>() < 0 || i.get<int64_t>() >= n)
        f.fail("attn_layer_indices", detail::concat("holds ", i.dump(), ", not a layer index in [0, ", n, ")"));
      x.layers[i.get<size_t>()] = false;
    }
  }
  if (arch == kBamba && f.number("z_loss_coefficient", 0.0) != 0.0)  // a loss term transformers adds in training
    f.fail("z_loss_coefficient", "above 0 is not supported (the loss is cross-entropy alone; set it to 0.0)");
  if (arch == kGraniteMoeHybrid && f.has("layer_types")) {
    const nlohmann::json& types = f.at("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != n) f.fail("layer_types", detail::concat("must list ", n, " layers"));
    for (int64_t i = 0; i < n; ++i) {
      const nlohmann::json& t = types[static_cast<size_t>(i)];
      const bool mamba = t == "mamba" || t == "linear_attention";
      if (!mamba && t != "attention" && t != "full_attention")
        f.fail("layer_types", "'" + t.dump() + "' is not supported (mamba, attention; linear_attention, full_attention)");
      x.layers[static_cast<size_t>(i)] = mamba;
    }
  }
  const int64_t big = int64_t{1} << 20, d = f.integer("hidden_size", 0, 1, big, true);
  const int64_t heads = f.integer("mamba_n_heads", 128, 1, big), inner = f.integer("mamba_expand", 2, 1, 64) * d;
  int64_t head_dim = inner / heads;
  if (f.has("mamba_d_head") && !(f.at("mamba_d_head").is_string() && f.at("mamba_d_head") == "auto")) head_dim = f.integer("mamba_d_head", 0, 1, big);
  if (head_dim * heads != inner)
    f.fail("mamba_d_head", detail::concat(head_dim, " x mamba_n_heads (", heads, ") is not mamba_expand x hidden_size (", inner, ")"));
  const int64_t groups = f.integer("mamba_n_groups", 1, 1, big);
  if (heads % groups) f.fail("mamba_n_groups", detail::concat("must divide mamba_n_heads (", heads, ")"));
  x.args = {{"mamba_heads", heads}, {"mamba_head_dim", head_dim}, {"mamba_state", f.integer("mamba_d_state", 256, 1, big)},
            {"mamba_groups", groups}, {"mamba_conv_kernel", f.integer("mamba_d_conv", 4, 1, 1024)},
            {"mamba_chunk", f.integer("mamba_chunk_size", 256, 1, big)}, {"mamba_conv_bias", f.boolean("mamba_conv_bias", true)},
            {"mamba_proj_bias", f.boolean("mamba_proj_bias", false)}};
  const double lo = step_limit(f, 0, 0.0), hi = step_limit(f, 1, std::numeric_limits<double>::infinity());
  if (!(lo >= 0) || !(hi >= lo)) f.fail("time_step_limit", detail::concat("must be 0 <= min <= max, got [", lo, ", ", hi, "]"));
  if (lo > 0) x.args["mamba_dt_min"] = lo;
  if (std::isfinite(hi)) x.args["mamba_dt_max"] = hi;
  return x;
}

}  // namespace

std::vector<std::string> mamba_tensor_names(const nlohmann::json& args) {
  std::vector<std::string> names{"in_proj.weight", "conv1d.weight", "dt_bias", "A_log", "D", "norm.weight", "out_proj.weight"};
  if (args.value("mamba_conv_bias", true)) names.push_back("conv1d.bias");
  if (args.value("mamba_proj_bias", false)) names.insert(names.end(), {"in_proj.bias", "out_proj.bias"});
  return names;
}

bool granite_hybrid_rotary(const Fields& f) {
  if (!f.has("position_embedding_type") || f.at_null("position_embedding_type")) return false;
  const std::string type = f.string("position_embedding_type", "nope");
  if (type != "rope" && type != "nope") f.fail("position_embedding_type", "'" + type + "' is not supported (rope, nope or null)");
  return type == "rope";
}

LinearLayers read_linear_layers(const std::string& arch, const Fields& f, int64_t n) {
  if (mamba_hybrid(arch)) return mamba_layers(arch, f, n);
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

void linear_attention_tensors(const std::string& arch, const LinearLayers& x, const std::string& ours, const std::string& theirs,
                              HfSpec& spec) {
  if (mamba_hybrid(arch)) {  // mamba.*
    for (const std::string& p : mamba_tensor_names(x.args)) spec.tensors.push_back({ours + "mamba." + p, theirs + "mamba." + p});
    return;
  }
  std::vector<std::string> names{"conv1d.weight", "dt_bias", "A_log", "norm.weight", "out_proj.weight"};
  if (arch == kQwen3Next) names.insert(names.begin(), {"in_proj_qkvz.weight", "in_proj_ba.weight"});
  else names.insert(names.begin(), {"in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight"});
  for (const std::string& p : names) spec.tensors.push_back({ours + "linear_attn." + p, theirs + "linear_attn." + p});
}

}  // namespace pipetrain::models::hf_detail
