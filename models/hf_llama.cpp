// The Llama family of the `hf` family (hf_fields.h): config.json read as llama_block arguments,
// layer by layer, with every parameter's two names.
#include <algorithm>
#include <cmath>

#include "models/decoder.h"
#include "models/hf_fields.h"

namespace pipetrain::models::hf_detail {

namespace {

using json = nlohmann::json;

// transformers' rope parameters, old ("rope_theta", "rope_scaling") or new ("rope_parameters"),
// as a llama_block's rope_theta, partial_rotary_factor and rope_scaling (whose defaults
// decoder_options.cpp resolves as transformers does: yarn's and longrope's attention factors).
// `params` is config.json's `key` (rope_parameters or rope_scaling, or one layer type's), `theta`
// the rope_theta where params has none. `dynamic` (NTK scaling that grows with the sequence)
// computes the default frequencies up to max_position_embeddings positions, as transformers does:
// windows of seq_len within them take those; beyond them, the llama_block's dynamic rope.
void read_rope(const std::string& arch, const Fields& f, const json& params, const std::string& key, double theta_default,
               int64_t seq_len, json& block) {
  if (!params.is_object()) f.fail(key, "must be an object, got " + params.dump());
  const Fields p(params, "");
  auto get = [&](const std::string& k, double def) {
    if (!p.has(k)) return def;
    if (!params.at(k).is_number()) f.fail(key + "." + k, "must be a number");
    return params.at(k).get<double>();
  };
  const double theta = get("rope_theta", theta_default);
  if (!(theta > 1)) f.fail("rope_theta", "must exceed 1");
  block["rope_theta"] = theta;
  // GLM-4.5's, GLM-4's and Bamba's default: half of each head rotated.
  const bool glm = arch == kGlm4Moe || arch == kGlm4 || arch == kBamba;
  // MiniMax-M2's checkpoints give rotary_dim, the rotated values of a head, for the factor.
  const double rotary_dim = arch == kMiniMaxM2 && f.has("rotary_dim")
                                ? double(f.integer("rotary_dim", 0, 2, 1 << 16)) / double(f.integer("head_dim", 128, 2, 1 << 16))
                                : 1.0;
  // Qwen3-Next's and Qwen3.5's default: a quarter of each head rotated.
  const double partial = get("partial_rotary_factor", f.number("partial_rotary_factor", glm ? 0.5 : qwen_hybrid(arch) ? 0.25 : rotary_dim));
  if (partial != 1.0 && arch != kPhi3 && !glm && arch != kMiniMaxM2 && !qwen_hybrid(arch))
    f.fail("partial_rotary_factor", detail::concat(partial, " is not supported for ", arch, " (its rotation turns the whole head)"));
  if (!(partial > 0 && partial <= 1)) f.fail("partial_rotary_factor", detail::concat("must be in (0, 1], got ", partial));
  if (partial != 1.0) block["partial_rotary_factor"] = partial;
  std::string type = "default";
  for (const char* k : {"rope_type", "type"})
    if (p.has(k)) {
      if (!params.at(k).is_string()) f.fail(key + "." + k, "must be a string");
      type = params.at(k).get<std::string>();
      break;
    }
  if (arch == kPhi3 && (type == "su" || type == "yarn")) type = "longrope";  // Phi3Config's own renaming
  if (type != "default" && type != "linear" && type != "llama3" && type != "yarn" && type != "longrope" && type != "dynamic")
    f.fail(key, "rope type '" + type + "' is not supported (default, linear, llama3, yarn, longrope, dynamic)");
  if (type == "dynamic" && arch == kHunyuan && p.has("alpha")) {
    // Hunyuan's NTK alpha: a larger base, fixed (the default frequencies of theta·alpha^(D/(D−2))).
    const double alpha = get("alpha", 1.0);
    if (!(alpha > 0)) f.fail(key + ".alpha", detail::concat("must be above 0, got ", alpha));
    if (!f.has("head_dim")) f.fail("head_dim", "is required with the alpha rope (transformers reads it)");
    const double D = double(f.integer("head_dim", 0, 4, 1 << 16));
    block["rope_theta"] = theta * std::pow(alpha, D / (D - 2));
    return;
  }
  if (type == "dynamic") {
    // Within max_position_embeddings, the default frequencies; beyond, the llama_block's dynamic
    // rope grows the base with each forward's last position (a window of seq_len: seq_len).
    const int64_t positions = f.integer("max_position_embeddings", 2048, 1, int64_t{1} << 30);
    if (seq_len <= positions) return;
    const double factor = get("factor", 1.0);
    if (!(factor >= 1)) f.fail(key + ".factor", detail::concat("must be at least 1, got ", factor));
    block["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", factor}, {"original_max_position_embeddings", positions}};
    return;
  }
  if (arch == kMinistral3) {  // its queries' scale beyond the pretraining length (llama_4_scaling_beta)
    if (!p.has("llama_4_scaling_beta") || !p.has("original_max_position_embeddings"))
      f.fail(key, "needs llama_4_scaling_beta and original_max_position_embeddings (Ministral 3's query scale)");
    const double beta = get("llama_4_scaling_beta", 0.0);
    if (!(beta >= 0)) f.fail(key + ".llama_4_scaling_beta", detail::concat("must be at least 0, got ", beta));
    if (beta > 0) {
      block["q_scale_beta"] = beta;
      block["q_scale_length"] = static_cast<int64_t>(get("original_max_position_embeddings", 1.0));
    }
  }
  if (type == "default") return;
  // The pretraining length: Phi-3's top-level original_max_position_embeddings (4096 where
  // config.json has none) first; otherwise the rope parameters', else the positions' (a top-level
  // one elsewhere is not read, as transformers does not).
  const int64_t big = int64_t{1} << 30;
  const int64_t positions = f.integer("max_position_embeddings", 8192, 1, big);
  int64_t original = static_cast<int64_t>(get("original_max_position_embeddings", double(positions)));
  if (arch == kPhi3) original = f.integer("original_max_position_embeddings", 4096, 1, big);
  // yarn's and longrope's factor, absent: the ratio of the positions to the pretraining length.
  const double factor = get("factor", type == "yarn" || type == "longrope" ? double(positions) / double(original) : 1.0);
  json s{{"rope_type", type}, {"factor", factor}};
  if (type != "linear") s["original_max_position_embeddings"] = original;
  if (type == "llama3") {
    s["low_freq_factor"] = get("low_freq_factor", 1.0);
    s["high_freq_factor"] = get("high_freq_factor", 4.0);
  }
  if ((type == "yarn" || type == "longrope") && p.has("attention_factor")) s["attention_factor"] = get("attention_factor", 1.0);
  if (type == "yarn")
    for (const char* k : {"mscale", "mscale_all_dim", "beta_fast", "beta_slow"})
      if (get(k, 0) != 0) s[k] = get(k, 0);  // transformers takes 0 as absent
  if (type == "yarn" && p.has("truncate")) {
    if (!params.at("truncate").is_boolean()) f.fail(key + ".truncate", "must be true or false");
    s["truncate"] = params.at("truncate");
  }
  if (type == "longrope")
    for (const char* k : {"short_factor", "long_factor"}) {
      if (!p.has(k)) f.fail(key + "." + k, "is required by longrope");
      s[k] = params.at(k);
    }
  block["rope_scaling"] = s;
}

// How an architecture's layer departs from Llama's (models/decoder.h).
struct Traits {
  bool olmo2 = false, gemma = false, gemma2 = false, gemma3 = false;  // olmo2: OLMo 2's and OLMo 3's layer
  bool olmo3 = false;
  bool gemma_any() const { return gemma || gemma2 || gemma3; }
  bool sandwich() const { return gemma2 || gemma3; }
};

// Which layers rotate q and k: all but SmolLM3's and Llama 4's NoPE layers (no_rope_layers: 1
// rotates, 0 does not; by default every no_rope_layer_interval-th layer does not).
std::vector<bool> rotary_layers(const std::string& arch, const Fields& f, int64_t n) {
  std::vector<bool> rotary(static_cast<size_t>(n), arch != kGraniteMoeHybrid || granite_hybrid_rotary(f));
  if (arch != kSmolLM3 && arch != kLlama4) return rotary;
  // Llama 4's empty list (Maverick's config.json) is its default, as transformers reads it.
  if (f.has("no_rope_layers") && !(arch == kLlama4 && f.at("no_rope_layers").empty())) {
    const json& list = f.at("no_rope_layers");
    if (!list.is_array() || static_cast<int64_t>(list.size()) != n) f.fail("no_rope_layers", detail::concat("must list ", n, " layers"));
    for (int64_t i = 0; i < n; ++i) {
      const json& v = list[static_cast<size_t>(i)];
      if (v != 0 && v != 1) f.fail("no_rope_layers", "holds " + v.dump() + ", not 0 or 1");
      rotary[static_cast<size_t>(i)] = v == 1;
    }
    return rotary;
  }
  const int64_t interval = f.integer("no_rope_layer_interval", 4, 1, 4096);
  for (int64_t i = 0; i < n; ++i) rotary[static_cast<size_t>(i)] = (i + 1) % interval != 0;
  return rotary;
}

// The windows of the layers: Mistral's and Phi-3's sliding_window on every layer; Qwen2's, Qwen3's
// and Gemma 2's and 3's on the layers layer_types names (Gemma 2's default every other from the
// first, Gemma 3's five of every six, sliding_window_pattern; older Qwen configs: from
// max_window_layers on when use_sliding_window); SmolLM3's, with use_sliding_window, on the
// layers layer_types names, by default its NoPE layers.
std::vector<int64_t> windows(const std::string& arch, const Fields& f, int64_t n) {
  const bool qwen = arch == kQwen2 || arch == kQwen2Moe || arch == kQwen3 || arch == kQwen3Moe, gemma = arch == kGemma2 || arch == kGemma3;
  const bool oss = arch == kGptOss, olmo3 = arch == kOlmo3, exaone = arch == kExaone4 || arch == kCohere2;  // Cohere 2's as EXAONE 4's
  std::vector<int64_t> window(static_cast<size_t>(n), 0);
  // 0: none (Qwen2-MoE's config writes 0 without use_sliding_window).
  const int64_t sliding = exaone && f.at_null("sliding_window") ? 0 : f.integer("sliding_window", gemma || olmo3 || exaone ? 4096 : oss ? 128 : 0, 0, int64_t{1} << 30);
  if (arch == kMistral || arch == kMinistral3 || arch == kMixtral || arch == kPhi3) std::fill(window.begin(), window.end(), sliding);
  if (arch == kSmolLM3) {
    const bool typed = f.has("layer_types");
    const json none = json::array();
    const json& types = typed ? f.at("layer_types") : none;
    if (typed && (!types.is_array() || static_cast<int64_t>(types.size()) != n)) f.fail("layer_types", detail::concat("must list ", n, " layers"));
    for (const json& t : types)
      if (t != "sliding_attention" && t != "full_attention")
        f.fail("layer_types", "'" + t.dump() + "' is not supported (full_attention, sliding_attention)");
    if (!f.boolean("use_sliding_window", false) || !sliding) return window;
    const std::vector<bool> rotary = rotary_layers(arch, f, n);
    for (int64_t i = 0; i < n; ++i)
      if (typed ? types[static_cast<size_t>(i)] == "sliding_attention" : !rotary[static_cast<size_t>(i)])
        window[static_cast<size_t>(i)] = sliding;
    return window;
  }
  if ((qwen || gemma || oss || olmo3 || exaone) && f.has("layer_types")) {
    const json& types = f.at("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != n) f.fail("layer_types", detail::concat("must list ", n, " layers"));
    for (int64_t i = 0; i < n; ++i) {
      const json& t = types[static_cast<size_t>(i)];
      if (t == "sliding_attention") {
        if (!sliding) f.fail("sliding_window", "is required by layer_types' sliding_attention");
        window[static_cast<size_t>(i)] = sliding;
      } else if (t != "full_attention") {
        f.fail("layer_types", "'" + t.dump() + "' is not supported (full_attention, sliding_attention)");
      }
    }
  } else if (gemma || oss || olmo3 || (exaone && sliding)) {
    // GPT-OSS's default: every other layer from the first, as Gemma 2's; OLMo 3's three of four;
    // EXAONE 4's sliding_window_pattern - 1 of each sliding_window_pattern (a string needs layer_types).
    if (exaone && f.has("sliding_window_pattern") && !f.at("sliding_window_pattern").is_number_integer())
      f.fail("sliding_window_pattern", "must be an integer where layer_types is not given, got " + f.at("sliding_window_pattern").dump());
    const int64_t pattern = arch == kGemma3 ? f.integer("sliding_window_pattern", 6, 1, 4096)
                            : exaone      ? f.integer("sliding_window_pattern", 4, 1, 4096)
                            : olmo3       ? 4
                                          : 2;
    for (int64_t i = 0; i < n; ++i) window[static_cast<size_t>(i)] = (i + 1) % pattern ? sliding : 0;
  } else if (qwen && f.boolean("use_sliding_window", false) && sliding) {
    for (int64_t i = f.integer("max_window_layers", 0, 0, 4096); i < n; ++i) window[static_cast<size_t>(i)] = sliding;
  }
  return window;
}

// Llama 4's chunks (0: none): attention_chunk_size on the layers layer_types names
// chunked_attention, by default its rotary layers (none where attention_chunk_size is null).
std::vector<int64_t> chunks(const std::string& arch, const Fields& f, const std::vector<bool>& rotary) {
  const int64_t n = static_cast<int64_t>(rotary.size());
  std::vector<int64_t> chunk(static_cast<size_t>(n), 0);
  if (arch != kLlama4) return chunk;
  const int64_t size = f.at_null("attention_chunk_size") ? 0 : f.integer("attention_chunk_size", 8192, 1, int64_t{1} << 30);
  if (!f.has("layer_types")) {
    for (int64_t i = 0; i < n; ++i) chunk[static_cast<size_t>(i)] = rotary[static_cast<size_t>(i)] ? size : 0;
    return chunk;
  }
  const json& types = f.at("layer_types");
  if (!types.is_array() || static_cast<int64_t>(types.size()) != n) f.fail("layer_types", detail::concat("must list ", n, " layers"));
  for (int64_t i = 0; i < n; ++i) {
    const json& t = types[static_cast<size_t>(i)];
    if (t == "chunked_attention") {
      if (!size) f.fail("attention_chunk_size", "is required by layer_types' chunked_attention");
      chunk[static_cast<size_t>(i)] = size;
    } else if (t != "full_attention") {
      f.fail("layer_types", "'" + t.dump() + "' is not supported (full_attention, chunked_attention)");
    }
  }
  return chunk;
}

// DeepSeek-V2's and V3's multi-head latent attention: a query and key head of qk_nope_head_dim +
// qk_rope_head_dim values (config.json's head_dim, which its config writes as qk_rope_head_dim, is
// not read), its scale qk_head_dim^-0.5 times yarn's mscale_all_dim correction squared where the
// rope is scaled (transformers' yarn_apply_mscale). Every head gets the expanded keys, so
// num_key_value_heads is not read (transformers' attention does not use it either).
void latent_attention_args(const std::string& arch, const Fields& f, int64_t heads, json& block) {
  const int64_t big = int64_t{1} << 20;
  const int64_t nope = f.integer("qk_nope_head_dim", 128, 0, big), rope = f.integer("qk_rope_head_dim", 64, 2, big);
  if (rope % 2) f.fail("qk_rope_head_dim", detail::concat("must be even (rotary positions turn pairs of values), got ", rope));
  block["n_kv_heads"] = heads;
  block["head_dim"] = nope + rope;
  block["rope_head_dim"] = rope;
  block["v_head_dim"] = f.integer("v_head_dim", 128, 1, big);
  block["kv_lora_rank"] = f.integer("kv_lora_rank", 512, 1, big);
  if (!f.at_null("q_lora_rank")) block["q_lora_rank"] = f.integer("q_lora_rank", 1536, 1, big);
  if (arch == kDeepseekV2) {  // its rotation: of interleaved pairs as complex numbers in float32, left interleaved
    block["rope_interleave"] = true;
    block["rope_pairs_kept"] = true;
    block["rope_float32"] = true;
  } else {
    block["rope_interleave"] = f.boolean("rope_interleave", true);
  }
  double scale = std::pow(double(nope + rope), -0.5);
  const json none = json::object();
  const json& p = f.has("rope_parameters") ? f.at("rope_parameters") : f.has("rope_scaling") ? f.at("rope_scaling") : none;
  const std::string type = p.is_object() ? p.value("rope_type", p.value("type", std::string("default"))) : "default";
  const double all_dim = p.is_object() && p.contains("mscale_all_dim") && p.at("mscale_all_dim").is_number() ? p.at("mscale_all_dim").get<double>() : 0.0;
  if (type != "default" && all_dim != 0) {
    if (!p.contains("factor") || !p.at("factor").is_number()) f.fail("rope_parameters.factor", "is required with mscale_all_dim");
    const double mscale = yarn_mscale(p.at("factor").get<double>(), all_dim);
    scale = scale * mscale * mscale;
  }
  block["attn_scale"] = scale;
}

// The arguments every llama_block of the model shares: sizes, biases, norms, activation,
// attention's scale and cap (the rope is read apart).
json llama_block_args(const std::string& arch, const Traits& t, const Fields& f, int64_t d, int64_t heads) {
  const int64_t big = int64_t{1} << 30;
  const int64_t kv = f.integer("num_key_value_heads", heads, 1, heads);
  if (heads % kv) f.fail("num_key_value_heads", detail::concat("must divide num_attention_heads (", heads, ")"));
  // Gemma's tanh GELU (Gemma 1's legacy "gelu" meant it too, as transformers reads it); SiLU elsewhere.
  const std::string act_key = t.sandwich() ? "hidden_activation" : "hidden_act";
  const std::string want = t.gemma_any() ? "gelu_pytorch_tanh" : arch == kArcee ? "relu2" : arch == kApertus ? "xielu" : "silu";
  std::string act = f.string(act_key, want);  // GPT-OSS's "silu" names its own (below)
  if (arch == kGemma && act == "gelu") act = "gelu_pytorch_tanh";
  if (act != want)
    f.fail(act_key, "'" + act + "' is not supported (" + (t.gemma_any() ? "GeGLU's gelu_pytorch_tanh" : arch == kArcee || arch == kApertus ? want : "SwiGLU's silu") + ")");
  for (const char* k : {"attention_dropout", "resid_pdrop", "embd_pdrop"})  // the last two Phi-3's
    if (f.number(k, 0.0) != 0.0) f.fail(k, "above 0 is not supported (set it to 0.0)");
  if (f.boolean("use_bidirectional_attention", false)) f.fail("use_bidirectional_attention", "true is not supported (causal attention)");
  // Qwen3.5-MoE's experts on every layer: no dense width; Granite 4.0-H's without experts: its shared MLP's.
  const bool granite_dense = arch == kGraniteMoeHybrid && f.integer("num_local_experts", 8, 0, 1 << 16) == 0;
  json block{{"type", "llama_block"}, {"d_model", d}, {"n_heads", heads}, {"n_kv_heads", kv},
             {"d_ff", arch == kQwen35Moe ? f.integer("moe_intermediate_size", 512, 1, big)
                      : granite_dense    ? f.integer("shared_intermediate_size", 1024, 1, big)
                                         : f.integer("intermediate_size", 0, 1, big, true)},
             {"eps", f.number("rms_norm_eps", arch == kGlm4 ? 1.5625e-7 : t.olmo2 || arch == kOlmoe || arch == kGlm4Moe || arch == kGptOss || arch == kMinistral3 ||
                                                   arch == kLlama4 || arch == kErnie45 || arch == kExaone4 || arch == kArcee || arch == kApertus || arch == kHunyuan || arch == kBamba ? 1e-5 : 1e-6)}};
  if (arch == kDeepseekV2 || arch == kDeepseekV3) latent_attention_args(arch, f, heads, block);
  else if (f.has("head_dim")) block["head_dim"] = f.integer("head_dim", 0, 2, 1 << 16);
  else if (arch == kQwen3 || arch == kQwen3Moe || arch == kLlama4 || arch == kGlm4 || arch == kErnie45 || arch == kMiniMaxM2)
    block["head_dim"] = 128;  // their configs' default
  else if (arch == kGptOss) block["head_dim"] = 64;
  else if (qwen_hybrid(arch)) block["head_dim"] = 256;
  else if (t.gemma_any()) block["head_dim"] = 256;   // Gemma's
  else if (d % heads) f.fail("num_attention_heads", detail::concat("must divide hidden_size (", d, ") when head_dim is not given"));
  const bool attention_bias =
      (arch == kLlama || granite_any(arch) || arch == kSmolLM3 || arch == kQwen3 || arch == kQwen3Moe || arch == kOlmoe || t.olmo2 ||
       t.gemma_any() || arch == kDeepseekV2 || arch == kDeepseekV3 || arch == kLlama4 || arch == kArcee || arch == kApertus || arch == kHunyuan ||
       qwen_hybrid(arch) || arch == kBamba || cohere_any(arch)) &&
      f.boolean("attention_bias", false);
  if (arch == kGptOss) {  // biases on q, k, v and o by default, a sink per head, its norms' scale before the cast
    block["qkv_bias"] = block["o_bias"] = f.boolean("attention_bias", true);
    block["mlp_bias"] = true;  // its experts'
    block["qk_norm"] = false;
    block["attn_sinks"] = true;
    block["norm_scale"] = "before_cast";
    block["act"] = "swiglu_oai";
    block["swiglu_alpha"] = f.number("swiglu_alpha", 1.702);
    block["swiglu_limit"] = f.number("swiglu_limit", 7.0);
    if (!(block["swiglu_alpha"].get<double>() > 0) || !(block["swiglu_limit"].get<double>() > 0))
      f.fail("swiglu_alpha", "and swiglu_limit must be above 0");
    return block;
  }
  // GLM-4.5's and GLM-4's attention_bias (GLM-4's true by default): on q, k and v, not o; Ernie 4.5's use_bias on every projection.
  const bool ernie_bias = arch == kErnie45 && f.boolean("use_bias", false);
  block["qkv_bias"] = arch == kQwen2 || (arch == kQwen2Moe && f.boolean("qkv_bias", true)) || attention_bias ||
                      (arch == kGlm4Moe && f.boolean("attention_bias", false)) || (arch == kGlm4 && f.boolean("attention_bias", true)) || ernie_bias;
  block["o_bias"] = attention_bias || ernie_bias;
  block["mlp_bias"] = ((arch == kLlama || arch == kGranite || arch == kSmolLM3 || arch == kArcee || arch == kBamba) && f.boolean("mlp_bias", false)) || ernie_bias;
  if (arch == kArcee || arch == kApertus) {  // their MLPs without a gate: down(relu(up(x))²), down(xielu(up(x)))
    block["act"] = arch == kArcee ? "relu2" : "xielu";
    block["mlp_gate"] = false;
  }
  if (arch == kGlm4 || arch == kErnie45) {  // their rotation of interleaved pairs (Ernie 4.5's in float32), left interleaved
    block["rope_interleave"] = block["rope_pairs_kept"] = true;
    if (arch == kErnie45) block["rope_float32"] = true;
  }
  if (arch == kGlm4) block["norms"] = "sandwich";  // its four norms a layer, under its own names
  if (arch == kExaone4) block["norms"] = "post";
  if (arch == kLlama4) {  // its dense layers' width; its rotation of interleaved pairs as complex numbers in float32, left interleaved
    block["d_ff"] = f.integer("intermediate_size_mlp", 16384, 1, big);
    block["rope_interleave"] = block["rope_pairs_kept"] = block["rope_float32"] = true;
  }
  if (arch == kDeepseekV2 && f.boolean("mlp_bias", false))  // on its dense MLPs but not its experts
    f.fail("mlp_bias", "true is not supported for DeepseekV2ForCausalLM (its experts would have none)");
  if (arch == kHunyuan) block["qk_norm_after_rope"] = true;  // its q/k norms on the rotated heads
  block["qk_norm"] = arch == kQwen3 || arch == kQwen3Moe || qwen_hybrid(arch) || arch == kApertus || arch == kHunyuan || arch == kOlmoe || t.olmo2 || t.gemma3 || arch == kExaone4 || arch == kMiniMaxM2 ||
                     (arch == kGlm4Moe && f.boolean("use_qk_norm", false));
  if (t.olmo2 || arch == kOlmoe || arch == kMiniMaxM2) block["qk_norm_over"] = "projection";
  if (cohere_any(arch)) cohere_args(f, arch, block);
  const double clip = arch == kOlmoe ? f.number("clip_qkv", 0.0) : 0.0;
  if (clip < 0) f.fail("clip_qkv", "must be positive");
  if (clip > 0) block["clip_qkv"] = clip;
  if (t.olmo2) {
    block["norms"] = "post";
    block["norm_scale"] = "before_cast";
    block["rope_float32"] = true;  // its rotary tables stay float32
  }
  if (t.gemma_any()) {
    block["norm_scale"] = "one_plus";
    block["act"] = "gelu_tanh";
  }
  if (qwen_hybrid(arch)) {  // their norms' (1 + weight); their attention's output gate
    block["norm_scale"] = "one_plus";
    block["attn_output_gate"] = true;
  }
  if (t.sandwich()) {
    block["norms"] = "sandwich";
    block["attn_scale"] = std::pow(double(f.integer("query_pre_attn_scalar", 256, 1, big)), -0.5);
  }
  const double cap = f.number("attn_logit_softcapping", t.gemma2 ? 50.0 : 0.0);
  if (cap < 0 || (cap > 0 && !t.sandwich())) f.fail("attn_logit_softcapping", detail::concat(cap, " is not supported for ", arch));
  if (cap > 0) block["attn_softcap"] = cap;
  if (granite_any(arch)) {  // its multipliers: attention's scale (1 by default, not 1/sqrt(head_dim)) and the residual's
    const double m = f.number("attention_multiplier", 1.0);
    if (!(m > 0)) f.fail("attention_multiplier", "must be above 0");
    block["attn_scale"] = m;
    block["residual_scale"] = f.number("residual_multiplier", 1.0);
  }
  return block;
}

// DeepSeek-V2's and V3's attention tensors (the names are transformers' and ours): q_proj or q_a_proj, its
// norm and q_b_proj; kv_a_proj_with_mqa, its norm, kv_b_proj; o_proj; attention_bias on q_a_proj,
// kv_a_proj_with_mqa and o_proj.
void latent_attention_tensors(const json& block, std::vector<std::string>& names) {
  const bool bias = block["qkv_bias"];
  auto linear = [&](const std::string& p, bool with_bias) {
    names.push_back("self_attn." + p + ".weight");
    if (with_bias) names.push_back("self_attn." + p + ".bias");
  };
  if (block.contains("q_lora_rank")) {
    linear("q_a_proj", bias);
    names.push_back("self_attn.q_a_layernorm.weight");
    linear("q_b_proj", false);
  } else {
    linear("q_proj", false);
  }
  linear("kv_a_proj_with_mqa", bias);
  names.push_back("self_attn.kv_a_layernorm.weight");
  linear("kv_b_proj", false);
  linear("o_proj", block["o_bias"].get<bool>());
}

// Llama 4's layer: its rotary layers' queries and keys RMS-normalized without a weight after the
// rotation (use_qk_norm), its NoPE layers' queries scaled by the temperature of their positions
// (attn_temperature_tuning: attn_scale, floor_scale) and their heads left as they are.
void llama4_layer(const Fields& f, bool rotary, json& b) {
  if (rotary) {
    if (f.boolean("use_qk_norm", true)) b["qk_l2_norm"] = true;
    return;
  }
  b.erase("rope_interleave");
  b.erase("rope_pairs_kept");
  const double scale = f.number("attn_scale", 0.1);
  if (scale < 0) f.fail("attn_scale", detail::concat("must be at least 0, got ", scale));
  if (f.boolean("attn_temperature_tuning", true) && scale > 0) {
    b["q_temperature"] = scale;
    b["q_temperature_floor"] = f.integer("floor_scale", 8192, 1, int64_t{1} << 30);
  }
}

}  // namespace

// The output head (lm_head, tied to the token embedding `embed` when `tied`) after `layers`, and
// the list for windows of seq_len tokens.
void with_head(HfSpec& spec, json& layers, int64_t d, int64_t vocab, int64_t seq_len, bool tied, const std::string& embed) {
  layers.push_back({{"name", "lm_head"}, {"type", "linear"}, {"in_features", d}, {"out_features", vocab}, {"bias", false}});
  spec.tensors.push_back({"lm_head.linear.weight", "lm_head.weight"});
  spec.tied = tied;
  spec.layers = {{"input_shape", json::array({seq_len})}, {"input_dtype", "long"}, {"layers", layers}};
  if (tied) spec.layers["ties"] = json::array({json::array({embed, "lm_head.linear.weight"})});
}

// Llama, Mistral, Qwen2, Qwen3, Phi-3, OLMo 2, Gemma, Gemma 2 and Gemma 3, Granite, GraniteMoE (and its shared expert), SmolLM3, Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V2 and V3, GLM-4.5, GPT-OSS, OLMo 3, Ministral 3, Llama 4, GLM-4, Ernie 4.5, EXAONE 4, MiniMax-M2 and Qwen3-Next
// (its gated DeltaNet layers, hf_linear.cpp):
// embed (Granite's embed_scale), layer_0..n-1 (llama_block), norm, lm_head (and Gemma 2's softcap,
// Granite's logits_scale). Phi-3 is Llama's math with q, k and v in
// one tensor and gate and up in another.
void llama_family(const std::string& arch, const Fields& f, int64_t seq_len, HfSpec& spec) {
  Traits t;
  t.olmo2 = arch == kOlmo2 || arch == kOlmo3;
  t.olmo3 = arch == kOlmo3;
  t.gemma = arch == kGemma;
  t.gemma2 = arch == kGemma2;
  t.gemma3 = arch == kGemma3;
  const int64_t big = int64_t{1} << 30;
  const int64_t vocab = f.integer("vocab_size", 0, 1, big, true), d = f.integer("hidden_size", 0, 1, big, true);
  const int64_t n = f.integer("num_hidden_layers", 0, 1, 4096, true), heads = f.integer("num_attention_heads", 0, 1, 1 << 16, true);
  const json block = llama_block_args(arch, t, f, d, heads);
  const int64_t kv = block["n_kv_heads"], ff = block["d_ff"];
  // The rope: Gemma 3's sliding layers have one of their own (rope_local_base_freq).
  json global = block, local = block;
  const json none = json::object();
  // OLMo 3's likewise (its sliding layers' rope without the scaling of the others; theta 500000).
  const bool nested = (t.gemma3 || t.olmo3) && f.has("rope_parameters") && f.at("rope_parameters").contains("full_attention");
  const double theta = t.olmo3 || arch == kLlama4 ? 5e5 : t.gemma3 ? 1e6 : 1e4;
  if (nested) {
    const json& p = f.at("rope_parameters");
    read_rope(arch, f, p.at("full_attention"), "rope_parameters.full_attention", theta, seq_len, global);
    read_rope(arch, f, p.value("sliding_attention", none), "rope_parameters.sliding_attention", t.olmo3 ? 5e5 : 1e4, seq_len, local);
  } else {
    const std::string key = f.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
    read_rope(arch, f, f.has(key) ? f.at(key) : none, key, f.number("rope_theta", theta), seq_len, global);
    if (t.gemma3) read_rope(arch, f, none, "rope_local_base_freq", f.number("rope_local_base_freq", 1e4), seq_len, local);
    if (t.olmo3) read_rope(arch, f, none, "rope_theta", f.number("rope_theta", theta), seq_len, local);
  }
  const std::vector<int64_t> window = windows(arch, f, n);
  std::vector<bool> rotary = rotary_layers(arch, f, n);
  if ((arch == kExaone4 || arch == kCohere2) && std::any_of(window.begin(), window.end(), [](int64_t w) { return w > 0; }))
    for (int64_t i = 0; i < n; ++i) rotary[static_cast<size_t>(i)] = window[static_cast<size_t>(i)] > 0;  // its full layers NoPE
  const std::vector<int64_t> chunk = chunks(arch, f, rotary);
  const Experts experts = read_experts(arch, f, n);
  const LinearLayers linear = read_linear_layers(arch, f, n);
  json layers = json::array();
  json embed{{"name", "embed"}, {"type", "embedding"}, {"num_embeddings", vocab}, {"embedding_dim", d}};
  // transformers' embedding takes pad_token_id as its padding_idx: that token's row takes no
  // gradient (negative counts from the end, as torch.nn.Embedding's does). Where config.json
  // has none, the architecture's default (Phi-3's 32000, OLMo 2's 1, Gemma's 0) if the
  // vocabulary holds it.
  const int64_t pad_default = arch == kPhi3 ? 32000 : arch == kSmolLM3 ? 128004 : arch == kMinistral3 ? 11 : arch == kGlm4 ? 151329
                              : t.olmo2 || arch == kOlmoe ? 1 : t.gemma_any() || arch == kErnie45 || arch == kBamba || cohere_any(arch) ? 0 : -1;
  if (f.has("pad_token_id")) {
    const int64_t pad = f.integer("pad_token_id", 0, -vocab, vocab - 1);
    embed["padding_idx"] = pad < 0 ? pad + vocab : pad;
  } else if (pad_default >= 0 && pad_default < vocab && !f.at_null("pad_token_id")) {
    embed["padding_idx"] = pad_default;
  }
  if (t.gemma_any()) embed["scale"] = std::pow(double(d), 0.5);  // hidden_size**0.5; float32 in the layer, as transformers' buffer
  layers.push_back(embed);
  spec.tensors.push_back({"embed.embedding.weight", "model.embed_tokens.weight"});
  // Granite's embedding multiplier and, after the head, its logits scaling: Python numbers.
  const bool granite = granite_any(arch);
  const double embedding_multiplier = granite ? f.number("embedding_multiplier", 1.0) : 1.0;
  const double logits_scaling = granite ? f.number("logits_scaling", 1.0) : 1.0;
  if (logits_scaling == 0) f.fail("logits_scaling", "must not be 0");
  if (embedding_multiplier != 1.0) layers.push_back({{"name", "embed_scale"}, {"type", "scale"}, {"by", embedding_multiplier}});
  for (int64_t i = 0; i < n; ++i) {
    json b = window[static_cast<size_t>(i)] > 0 && (t.gemma3 || t.olmo3) ? local : global;
    b["name"] = detail::concat("layer_", i);
    // A window as long as the sequence changes nothing.
    if (window[static_cast<size_t>(i)] > 0 && window[static_cast<size_t>(i)] < seq_len) b["sliding_window"] = window[static_cast<size_t>(i)];
    if (experts.layers[static_cast<size_t>(i)]) b.update(experts.args);
    if (!rotary[static_cast<size_t>(i)]) {  // no positions, nor the rotation's options (Cohere 2's full layers)
      b["rotary"] = false;
      b.erase("rope_interleave");
      b.erase("rope_pairs_kept");
    }
    // A chunk holding the whole sequence changes nothing (as a window).
    if (chunk[static_cast<size_t>(i)] > 0 && chunk[static_cast<size_t>(i)] < seq_len) b["attention_chunk"] = chunk[static_cast<size_t>(i)];
    if (arch == kLlama4) llama4_layer(f, rotary[static_cast<size_t>(i)], b);
    if (linear.layers[static_cast<size_t>(i)]) {  // the gated DeltaNet in attention's place
      b.update(linear.args);
      b.erase("qk_norm");
      b.erase("attn_output_gate");
    }
    layers.push_back(b);
  }
  const bool qkv_bias = block["qkv_bias"], o_bias = block["o_bias"], mlp_bias = block["mlp_bias"], qk_norm = block["qk_norm"];
  const int64_t D = block.contains("head_dim") ? block["head_dim"].get<int64_t>() : d / heads;
  std::vector<std::string> norms{"input_layernorm.weight", "post_attention_layernorm.weight"};
  if (t.olmo2 || arch == kExaone4) norms = {"post_attention_layernorm.weight", "post_feedforward_layernorm.weight"};
  if (arch == kApertus) norms.clear();  // under its own names (below)
  if (cohere_any(arch) || arch == kBamba) norms = {"input_layernorm.weight"};  // one norm a layer (Bamba's second: below)
  if (t.sandwich()) norms.insert(norms.end(), {"pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight"});
  for (int64_t i = 0; i < n; ++i) {
    const std::string ours = detail::concat("layer_", i, ".llama."), theirs = detail::concat("model.layers.", i, ".");
    if (arch == kPhi3) {  // qkv_proj: q's rows, then k's, then v's; gate_up_proj: gate's, then up's
      const std::string qkv = theirs + "self_attn.qkv_proj.weight", gate_up = theirs + "mlp.gate_up_proj.weight";
      spec.tensors.push_back({ours + "self_attn.q_proj.weight", qkv, false, 0, heads * D});
      spec.tensors.push_back({ours + "self_attn.k_proj.weight", qkv, false, heads * D, kv * D});
      spec.tensors.push_back({ours + "self_attn.v_proj.weight", qkv, false, (heads + kv) * D, kv * D});
      spec.tensors.push_back({ours + "mlp.gate_proj.weight", gate_up, false, 0, ff});
      spec.tensors.push_back({ours + "mlp.up_proj.weight", gate_up, false, ff, ff});
      for (const char* s : {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.weight", "mlp.down_proj.weight"})
        spec.tensors.push_back({ours + s, theirs + s});
      continue;
    }
    std::vector<std::string> names = arch == kGlm4 ? std::vector<std::string>{} : norms;
    if (arch == kGlm4)  // Gemma 2's four norms under GLM-4's names: after attention, before and after the MLP
      for (const auto& [mine, glms] : std::vector<std::pair<std::string, std::string>>{
               {"input_layernorm", "input_layernorm"}, {"post_attention_layernorm", "post_self_attn_layernorm"},
               {"pre_feedforward_layernorm", "post_attention_layernorm"}, {"post_feedforward_layernorm", "post_mlp_layernorm"}})
        spec.tensors.push_back({ours + mine + ".weight", theirs + glms + ".weight"});
    if (arch == kApertus) {  // its two norms' names; its activation's two trained scalars and two buffers
      spec.tensors.push_back({ours + "input_layernorm.weight", theirs + "attention_layernorm.weight"});
      spec.tensors.push_back({ours + "post_attention_layernorm.weight", theirs + "feedforward_layernorm.weight"});
      for (const char* a : {"alpha_p", "alpha_n", "beta", "eps"}) spec.tensors.push_back({ours + "mlp.act_fn." + a, theirs + "mlp.act_fn." + a});
    }
    if (linear.layers[static_cast<size_t>(i)]) {
      linear_attention_tensors(arch, linear, ours, theirs, spec);
    } else if (arch == kDeepseekV2 || arch == kDeepseekV3) {
      latent_attention_tensors(block, names);
    } else {
      for (const char* p : {"q", "k", "v", "o"}) {
        names.push_back(detail::concat("self_attn.", p, "_proj.weight"));
        if (std::string(p) == "o" ? o_bias : qkv_bias) names.push_back(detail::concat("self_attn.", p, "_proj.bias"));
      }
    }
    if (qk_norm && arch == kHunyuan) {  // under its names
      spec.tensors.push_back({ours + "self_attn.q_norm.weight", theirs + "self_attn.query_layernorm.weight"});
      spec.tensors.push_back({ours + "self_attn.k_norm.weight", theirs + "self_attn.key_layernorm.weight"});
    } else if (qk_norm && !linear.layers[static_cast<size_t>(i)]) {
      names.insert(names.end(), {"self_attn.q_norm.weight", "self_attn.k_norm.weight"});
    }
    if (arch == kGptOss) names.push_back("self_attn.sinks");
    if (experts.layers[static_cast<size_t>(i)]) {
      for (const std::string& s : names) spec.tensors.push_back({ours + s, theirs + s});
      expert_tensors(arch, experts, ff, ours, theirs, spec);
      continue;
    }
    for (const std::string& s : names) spec.tensors.push_back({ours + s, theirs + s});
    if (arch == kGraniteMoeHybrid) {
      granite_dense_mlp_tensors(ff, ours, theirs, spec);
      continue;
    }
    const std::string mlp = arch == kLlama4 || arch == kBamba ? "feed_forward." : "mlp.";  // Llama 4's and Bamba's name of their MLPs
    if (arch == kBamba) spec.tensors.push_back({ours + "post_attention_layernorm.weight", theirs + "pre_ff_layernorm.weight"});
    if (arch == kGlm4) {  // gate_up_proj: gate's rows, then up's
      spec.tensors.push_back({ours + "mlp.gate_proj.weight", theirs + "mlp.gate_up_proj.weight", false, 0, ff});
      spec.tensors.push_back({ours + "mlp.up_proj.weight", theirs + "mlp.gate_up_proj.weight", false, ff, ff});
      spec.tensors.push_back({ours + "mlp.down_proj.weight", theirs + "mlp.down_proj.weight"});
      continue;
    }
    for (const char* p : {"gate", "up", "down"})
      for (const char* kind : {"weight", "bias"})
        if ((kind == std::string("weight") || mlp_bias) && (!block.contains("mlp_gate") || p != std::string("gate")))
          spec.tensors.push_back({detail::concat(ours, "mlp.", p, "_proj.", kind), detail::concat(theirs, mlp, p, "_proj.", kind)});
  }
  if (arch == kDeepseekV3 || arch == kGlm4Moe)  // their multi-token prediction layers, after the others: not part of the causal model
    for (int64_t i = n; i < n + f.integer("num_nextn_predict_layers", f.integer("num_mtp_layers", 1, 0, 64), 0, 64); ++i)
      spec.ignored.push_back(detail::concat("model.layers.", i, "."));
  json norm{{"name", "norm"}, {"type", "rmsnorm"}, {"normalized_shape", d}, {"eps", block["eps"]}};
  if (block.contains("norm_scale")) norm["scale"] = block["norm_scale"];
  if (block.contains("norm_center")) norm["center"] = block["norm_center"];
  layers.push_back(norm);
  spec.tensors.push_back({"norm.rms.weight", arch == kBamba ? "model.final_layernorm.weight" : "model.norm.weight"});
  with_head(spec, layers, d, vocab, seq_len, f.boolean("tie_word_embeddings", t.gemma_any() || arch == kSmolLM3 || arch == kErnie45 || cohere_any(arch)), "embed.embedding.weight");
  const double cap = f.number("final_logit_softcapping", t.gemma2 ? 30.0 : 0.0);
  if (cap < 0 || (cap > 0 && !t.sandwich())) f.fail("final_logit_softcapping", detail::concat(cap, " is not supported for ", arch));
  if (cap > 0) spec.layers["layers"].push_back({{"name", "softcap"}, {"type", "softcap"}, {"cap", cap}});
  if (logits_scaling != 1.0)
    spec.layers["layers"].push_back({{"name", "logits_scale"}, {"type", "scale"}, {"by", logits_scaling}, {"op", "divide"}});
  if (cohere_any(arch)) cohere_logit_scale(f, spec);
}

}  // namespace pipetrain::models::hf_detail
