// The decoder blocks' arguments as a layer list spells them (models/decoder.h).
#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/strings.h"
#include "models/decoder.h"

namespace pipetrain::models {

namespace {
// transformers' yarn attention factor from its factor and mscales when none is given.
double yarn_attention_factor(double factor, double mscale, double mscale_all_dim) {
  return mscale != 0 && mscale_all_dim != 0 ? yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim) : yarn_mscale(factor);
}

// rope_theta, partial_rotary_factor, and rope_scaling as transformers writes it ({"rope_type":
// "linear" | "llama3" | "yarn" | "longrope" | "dynamic", "factor", ...}); other kinds are refused by name.
Rope read_rope(JsonReader& r, int64_t head_dim) {
  Rope rope;
  rope.theta = r.get_number("rope_theta", 10000.0, 1.0, 1e12);
  rope.partial = r.get_number("partial_rotary_factor", 1.0, 1e-6, 1.0);
  const int64_t dim = rotary_dim(rope, head_dim);
  if (dim < 2 || dim % 2)
    r.fail("partial_rotary_factor", detail::concat("turns ", dim, " of head_dim's ", head_dim, " values; it must be an even number above 0"));
  if (!r.has("rope_scaling")) return rope;
  JsonReader s = r.child("rope_scaling");
  rope.type = s.get_choice("rope_type", "default", {"default", "linear", "llama3", "yarn", "longrope", "dynamic"});
  if (rope.type == "linear" || rope.type == "llama3" || rope.type == "yarn") rope.factor = s.get_number("factor", 1.0, 1e-6, 1e6);
  if (rope.type == "dynamic") {
    rope.factor = s.get_number("factor", 1.0, 1.0, 1e6);
    if (!s.has("original_max_position_embeddings")) s.fail("original_max_position_embeddings", "is required by dynamic");
    rope.original_max_positions = s.get_int("original_max_position_embeddings", 0, 1, int64_t{1} << 30);
    if (dim <= 2) s.fail("rope_type", detail::concat("dynamic needs more than 2 rotated values a head, got ", dim));
  }
  if (rope.type == "llama3") {
    rope.low_freq_factor = s.get_number("low_freq_factor", 1.0, 1e-6, 1e6);
    rope.high_freq_factor = s.get_number("high_freq_factor", 4.0, 1e-6, 1e6);
    if (rope.high_freq_factor <= rope.low_freq_factor) s.fail("high_freq_factor", "must exceed low_freq_factor");
    rope.original_max_positions = s.get_int("original_max_position_embeddings", 8192, 1, int64_t{1} << 30);
  }
  if (rope.type == "yarn" || rope.type == "longrope") {
    if (!s.has("original_max_position_embeddings")) s.fail("original_max_position_embeddings", "is required by " + rope.type);
    rope.original_max_positions = s.get_int("original_max_position_embeddings", 0, 1, int64_t{1} << 30);
  }
  if (rope.type == "yarn") {
    rope.beta_fast = s.get_number("beta_fast", 32.0, 1e-6, 1e6);
    rope.beta_slow = s.get_number("beta_slow", 1.0, 1e-6, 1e6);
    rope.truncate = s.get_bool("truncate", true);
    const double mscale = s.get_number("mscale", 0.0, 0.0, 1e6), all_dim = s.get_number("mscale_all_dim", 0.0, 0.0, 1e6);
    rope.attention_factor = s.get_number("attention_factor", yarn_attention_factor(rope.factor, mscale, all_dim), 1e-6, 1e6);
  }
  if (rope.type == "longrope") {
    for (const char* k : {"short_factor", "long_factor"}) {
      if (!s.has(k)) s.fail(k, "is required by longrope (one factor per rotated pair)");
      std::vector<double> f = s.get_numbers(k, {});
      if (static_cast<int64_t>(f.size()) != dim / 2) s.fail(k, detail::concat("must hold ", dim / 2, " factors (one per rotated pair), got ", f.size()));
      for (double x : f)
        if (!(x > 0)) s.fail(k, detail::concat("must be positive, got ", x));
      (std::string(k) == "short_factor" ? rope.short_factor : rope.long_factor) = std::move(f);
    }
    // transformers' default: sqrt(1 + ln(factor) / ln(original)) for factor above 1
    const double factor = s.get_number("factor", 1.0, 1e-6, 1e6), old = static_cast<double>(rope.original_max_positions);
    const double def = factor <= 1 || old <= 1 ? 1.0 : std::sqrt(1 + std::log(factor) / std::log(old));
    rope.attention_factor = s.get_number("attention_factor", def, 1e-6, 1e6);
  }
  s.finish();
  return rope;
}

// DeepSeek's multi-head latent attention: kv_lora_rank above 0 and its other keys.
void read_latent_attention(JsonReader& r, LlamaBlockOptions& o) {
  o.kv_lora_rank = r.get_int("kv_lora_rank", 0, 0, int64_t{1} << 20);
  if (!o.mla()) {
    for (const char* k : {"q_lora_rank", "rope_head_dim", "v_head_dim", "latent_eps"})
      if (r.has(k)) r.fail(k, "needs kv_lora_rank above 0 (latent attention)");
    return;
  }
  if (r.has("n_kv_heads") && o.n_kv_heads != o.n_heads) r.fail("n_kv_heads", "must equal n_heads with latent attention (kv_lora_rank)");
  o.q_lora_rank = r.get_int("q_lora_rank", 0, 0, int64_t{1} << 20);
  if (!r.has("rope_head_dim")) r.fail("rope_head_dim", "is required with kv_lora_rank (the rotated values at the end of each head)");
  o.rope_head_dim = r.get_int("rope_head_dim", 0, 2, o.head_dim);
  if (o.rope_head_dim % 2) r.fail("rope_head_dim", "must be even (rotary positions turn pairs of values)");
  o.v_head_dim = r.get_int("v_head_dim", o.head_dim, 1, 1 << 16);
  o.latent_eps = r.get_number("latent_eps", 1e-6, 1e-12, 1.0);
}

// The router: softmax (default; DeepSeek-V2's within groups) or DeepSeek-V3's sigmoid with its
// correction bias and groups.
void read_router(JsonReader& r, LlamaBlockOptions& o) {
  const std::string router = r.get_choice("router", "softmax", {"softmax", "sigmoid", "softmax_top", "sigmoid_top"});
  o.router_sigmoid = router == "sigmoid";
  o.router_top_softmax = router == "softmax_top";
  o.router_top_sigmoid = router == "sigmoid_top";
  if (o.router_top_sigmoid && r.has("normalize_experts"))
    r.fail("normalize_experts", "is not read with router \"sigmoid_top\" (the chosen experts' weights are their sigmoids)");
  o.router_logit_bias = r.get_bool("router_logit_bias", false);
  if (!o.router_sigmoid && r.has("router_bias")) r.fail("router_bias", "needs router \"sigmoid\"");
  if ((o.router_top_softmax || o.router_top_sigmoid) && r.has("expert_groups")) r.fail("expert_groups", "needs router \"softmax\" or \"sigmoid\"");
  o.router_bias = r.get_bool("router_bias", false);
  o.expert_groups = r.get_int("expert_groups", 1, 1, std::max<int64_t>(o.experts, 1));
  if (o.experts % o.expert_groups || (o.router_sigmoid && o.expert_groups > 1 && o.experts / o.expert_groups < 2))
    r.fail("expert_groups", detail::concat("must divide experts (", o.experts, ")", o.router_sigmoid ? " into groups of at least 2" : ""));
  o.groups_per_token = r.get_int("groups_per_token", o.expert_groups, 1, o.expert_groups);
  if (o.experts > 0 && o.groups_per_token * (o.experts / o.expert_groups) < o.experts_per_token)
    r.fail("groups_per_token", detail::concat("leaves fewer experts than experts_per_token (", o.experts_per_token, ") to choose from"));
  o.routed_scale = r.get_number("routed_scale", 1.0, 1e-6, 1e6);
  o.router_float32 = r.get_bool("router_float32", false);
  o.router_scales_input = r.get_bool("router_scales_input", false);
  o.grouped_experts = r.get_choice("experts_kernel", "loop", {"loop", "grouped"}) == "grouped";
}

// Qwen3-Next's gated DeltaNet in attention's place: its heads, their sizes, its convolution's width.
void read_gated_deltanet(JsonReader& r, LlamaBlockOptions& o) {
  const int64_t big = int64_t{1} << 20;
  o.linear_key_heads = r.get_int("linear_key_heads", 0, 0, big);
  if (o.linear_key_heads == 0) {
    for (const char* k : {"linear_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel", "linear_projections"})
      if (r.has(k)) r.fail(k, "needs linear_key_heads above 0 (the gated DeltaNet)");
    return;
  }
  o.linear_value_heads = r.get_int("linear_value_heads", o.linear_key_heads, 1, big);
  if (o.linear_value_heads % o.linear_key_heads)
    r.fail("linear_value_heads", detail::concat("must be a multiple of linear_key_heads (", o.linear_key_heads, ")"));
  o.linear_key_head_dim = r.require_int("linear_key_head_dim", 1, big);
  o.linear_value_head_dim = r.require_int("linear_value_head_dim", 1, big);
  o.linear_conv_kernel = r.get_int("linear_conv_kernel", 4, 1, 1024);
  o.linear_split = r.get_choice("linear_projections", "fused", {"fused", "split"}) == "split";
  if (o.mla()) r.fail("linear_key_heads", "cannot be set with kv_lora_rank (the gated DeltaNet replaces attention)");
  const std::pair<const char*, bool> attention_only[] = {{"attn_sinks", o.attn_sinks}, {"attn_output_gate", o.attn_output_gate},
      {"sliding_window", o.sliding_window > 0}, {"attention_chunk", o.attention_chunk > 0}, {"attn_softcap", o.attn_softcap > 0},
      {"qk_norm", o.qk_norm}, {"qk_l2_norm", o.qk_l2_norm}};
  for (const auto& [key, set] : attention_only)
    if (set) r.fail(key, "does not apply to the gated DeltaNet (linear_key_heads above 0 replaces attention)");
}

// Mamba 2's mixer in attention's place: its heads, their sizes, its state, groups, convolution, chunks.
void read_mamba(JsonReader& r, LlamaBlockOptions& o) {
  const int64_t big = int64_t{1} << 20;
  o.mamba_heads = r.get_int("mamba_heads", 0, 0, big);
  if (o.mamba_heads == 0) {
    for (const char* k : {"mamba_head_dim", "mamba_state", "mamba_groups", "mamba_conv_kernel", "mamba_chunk", "mamba_conv_bias",
                          "mamba_proj_bias", "mamba_dt_min", "mamba_dt_max"})
      if (r.has(k)) r.fail(k, "needs mamba_heads above 0 (Mamba 2's mixer)");
    return;
  }
  o.mamba_head_dim = r.require_int("mamba_head_dim", 1, big);
  o.mamba_state = r.require_int("mamba_state", 1, big);
  o.mamba_groups = r.get_int("mamba_groups", 1, 1, big);
  if (o.mamba_heads % o.mamba_groups) r.fail("mamba_groups", detail::concat("must divide mamba_heads (", o.mamba_heads, ")"));
  o.mamba_conv_kernel = r.get_int("mamba_conv_kernel", 4, 1, 1024);
  o.mamba_chunk = r.get_int("mamba_chunk", 256, 1, big);
  o.mamba_conv_bias = r.get_bool("mamba_conv_bias", true);
  o.mamba_proj_bias = r.get_bool("mamba_proj_bias", false);
  o.mamba_dt_min = r.get_number("mamba_dt_min", 0.0, 0.0, 1e30);
  o.mamba_dt_max = r.has("mamba_dt_max") ? r.get_number("mamba_dt_max", 1e30, 0.0, 1e30) : std::numeric_limits<double>::infinity();
  if (o.mamba_dt_max < o.mamba_dt_min) r.fail("mamba_dt_max", detail::concat("must be at least mamba_dt_min (", o.mamba_dt_min, ")"));
  if (o.mla() || o.gated_deltanet())
    r.fail("mamba_heads", "cannot be set with kv_lora_rank or linear_key_heads (Mamba 2's mixer replaces attention)");
  const std::pair<const char*, bool> attention_only[] = {{"attn_sinks", o.attn_sinks}, {"attn_output_gate", o.attn_output_gate},
      {"sliding_window", o.sliding_window > 0}, {"attention_chunk", o.attention_chunk > 0}, {"attn_softcap", o.attn_softcap > 0},
      {"qk_norm", o.qk_norm}, {"qk_l2_norm", o.qk_l2_norm}};
  for (const auto& [key, set] : attention_only)
    if (set) r.fail(key, "does not apply to Mamba 2's mixer (mamba_heads above 0 replaces attention)");
}

// LoRA's adapters (models/lora.h): lora_rank, lora_alpha, lora_dropout, lora_rslora and
// lora_targets (projection names, or "all": every one the block has), each needing what it adapts.
void read_lora(JsonReader& r, LlamaBlockOptions& o) {
  Lora& l = o.lora;
  l.rank = r.get_int("lora_rank", 0, 0, 1 << 16);
  for (const char* key : {"lora_alpha", "lora_dropout", "lora_rslora", "lora_targets"})
    if (l.rank == 0 && r.has(key)) r.fail(key, "needs lora_rank above 0");
  if (l.rank == 0) return;
  l.alpha = r.get_number("lora_alpha", 8.0, 1e-6, 1e6);
  l.dropout = r.get_number("lora_dropout", 0.0, 0.0, 0.99);
  l.rslora = r.get_bool("lora_rslora", false);
  const bool attention = !o.no_mixer && !o.mla() && !o.mamba() && !o.gated_deltanet(), mlp = !o.no_mlp && o.experts == 0;
  auto has = [&](const std::string& t) {
    return t == "gate_proj" ? mlp && o.mlp_gate : t == "up_proj" || t == "down_proj" ? mlp : attention;
  };
  const LoraTargets wanted = read_lora_targets(r, "lora_targets");
  for (const std::string& name : wanted.names) {
    if (has(name)) l.targets.push_back(name);
    else if (!wanted.all)
      r.fail("lora_targets", detail::concat("names ", name, ", which the block does not have as a projection of its own (attention's need ",
                                            "no latents or other mixer; the MLP's, no experts; gate_proj, mlp_gate true)"));
  }
  if (l.targets.empty()) r.fail("lora_targets", "\"all\" finds no projection: the block has neither attention of its own nor one MLP");
}

}  // namespace

double yarn_mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

LlamaBlockOptions read_llama_block(JsonReader& r) {
  LlamaBlockOptions o;
  o.d_model = r.require_int("d_model", 1, int64_t{1} << 30);
  o.n_heads = r.require_int("n_heads", 1, int64_t{1} << 30);
  o.n_kv_heads = r.get_int("n_kv_heads", o.n_heads, 1, o.n_heads);
  if (o.n_heads % o.n_kv_heads) r.fail("n_kv_heads", detail::concat("must divide n_heads (", o.n_heads, ")"));
  if (!r.has("head_dim") && o.d_model % o.n_heads) r.fail("n_heads", detail::concat("must divide d_model (", o.d_model, "), or give head_dim"));
  o.head_dim = r.get_int("head_dim", o.d_model / o.n_heads, 2, 1 << 16);
  read_latent_attention(r, o);
  if (!o.mla() && o.head_dim % 2) r.fail("head_dim", "must be even (rotary positions turn pairs of values)");
  o.d_ff = r.require_int("d_ff", 1, int64_t{1} << 30);
  o.eps = r.get_number("eps", 1e-6, 1e-12, 1.0);
  o.rope = read_rope(r, o.mla() ? o.rope_head_dim : o.head_dim);
  o.qkv_bias = r.get_bool("qkv_bias", false);
  o.o_bias = r.get_bool("o_bias", false);
  o.mlp_bias = r.get_bool("mlp_bias", false);
  o.qk_norm = r.get_bool("qk_norm", false);
  const std::string over = r.get_choice("qk_norm_over", "head", {"head", "projection", "each_head"});
  o.qk_norm_projection = over == "projection";
  o.qk_norm_each_head = over == "each_head";
  if (r.has("qk_norm_over") && !o.qk_norm) r.fail("qk_norm_over", "needs qk_norm true");
  o.qk_norm_after_rope = r.get_bool("qk_norm_after_rope", false);
  if (o.qk_norm_after_rope && (!o.qk_norm || o.qk_norm_projection))
    r.fail("qk_norm_after_rope", "needs qk_norm over each head (qk_norm true, qk_norm_over \"head\" or \"each_head\")");
  o.sliding_window = r.get_int("sliding_window", 0, 0, int64_t{1} << 30);
  const std::string norms = r.get_choice("norms", "pre", {"pre", "post", "sandwich", "parallel", "parallel_two"});
  o.norms = norms == "pre" ? NormPlacement::Pre : norms == "post" ? NormPlacement::Post : norms == "sandwich" ? NormPlacement::Sandwich
            : norms == "parallel" ? NormPlacement::Parallel : NormPlacement::ParallelTwo;
  const bool parallel = o.norms == NormPlacement::Parallel || o.norms == NormPlacement::ParallelTwo;
  if (r.has("parallel_sum") && !parallel) r.fail("parallel_sum", "needs norms \"parallel\" or \"parallel_two\"");
  o.parallel_branches_first = r.get_choice("parallel_sum", "residual_first", {"residual_first", "branches_first"}) == "branches_first";
  o.norm_center = r.get_bool("norm_center", false);
  o.norm_bias = r.get_bool("norm_bias", false);
  if (o.norm_bias && !o.norm_center) r.fail("norm_bias", "needs norm_center true (a LayerNorm)");
  o.qk_norm_bias = r.get_bool("qk_norm_bias", false);
  if (o.qk_norm_bias && (!o.qk_norm || !o.norm_center || o.qk_norm_projection || o.qk_norm_each_head))
    r.fail("qk_norm_bias", "needs qk_norm over heads with one weight (qk_norm_over \"head\") and norm_center true (a LayerNorm of each head)");
  o.norm_scale = read_rms_scale(r, "norm_scale");
  const std::string act = r.get_choice("act", "silu", {"silu", "gelu_tanh", "swiglu_oai", "relu2", "xielu", "gelu", "gelu_new", "gelu_fast"});
  o.gelu = act == "gelu_tanh" ? Gelu::Tanh : act == "gelu" ? Gelu::Erf : act == "gelu_new" ? Gelu::New : act == "gelu_fast" ? Gelu::Fast : Gelu::None;
  o.relu2 = act == "relu2";
  o.mlp_gate = r.get_bool("mlp_gate", true);
  o.xielu = act == "xielu";
  if (o.xielu && o.mlp_gate) r.fail("act", "\"xielu\" needs mlp_gate false (Apertus's MLP without a gate)");
  if (!o.mlp_gate && act == "swiglu_oai") r.fail("mlp_gate", "false needs an act other than \"swiglu_oai\" (it is gated)");
  if (act != "swiglu_oai")
    for (const char* k : {"swiglu_alpha", "swiglu_limit"})
      if (r.has(k)) r.fail(k, "needs act \"swiglu_oai\"");
  if (act == "swiglu_oai") {
    o.swiglu_alpha = r.get_number("swiglu_alpha", 1.702, 1e-6, 1e6);
    o.swiglu_limit = r.get_number("swiglu_limit", 7.0, 1e-6, 1e6);
  }
  o.attn_sinks = r.get_bool("attn_sinks", false);
  o.attn_output_gate = r.get_bool("attn_output_gate", false);
  o.attn_scale = r.get_number("attn_scale", 0.0, 0.0, 1e6);
  o.attn_softcap = r.get_number("attn_softcap", 0.0, 0.0, 1e6);
  const std::string kv_heads = r.get_choice("kv_heads", "grouped", {"grouped", "repeated", "broadcast"});
  o.kv_heads = kv_heads == "grouped" ? KvHeads::Grouped : kv_heads == "repeated" ? KvHeads::Repeated : KvHeads::Broadcast;
  if (o.kv_heads == KvHeads::Broadcast && o.n_kv_heads != 1) r.fail("kv_heads", "\"broadcast\" needs n_kv_heads 1 (one key and value head)");
  o.experts = r.get_int("experts", 0, 0, 1 << 16);
  if (o.experts > 0 && !o.mlp_gate && !o.relu2) r.fail("mlp_gate", "false with experts needs act \"relu2\" (Nemotron-H's experts)");
  if (o.experts == 0)
    for (const char* k : {"experts_per_token", "normalize_experts", "router_cast", "shared_expert", "shared_expert_gate", "router",
                          "router_bias", "expert_groups", "groups_per_token", "routed_scale", "router_float32", "router_logit_bias",
                          "router_scales_input", "experts_kernel", "experts_sum_float32", "experts_latent"})
      if (r.has(k)) r.fail(k, "needs experts above 0");
  o.experts_per_token = r.get_int("experts_per_token", std::min<int64_t>(2, std::max<int64_t>(o.experts, 1)), 1, std::max<int64_t>(o.experts, 1));
  o.normalize_experts = r.get_bool("normalize_experts", true);
  o.router_cast = r.get_bool("router_cast", false);
  o.experts_sum_float32 = r.get_bool("experts_sum_float32", false);
  o.experts_latent = r.get_int("experts_latent", 0, 0, int64_t{1} << 24);
  if (o.experts_latent > 0 && r.get_choice("experts_kernel", "loop", {"loop", "grouped"}) == "grouped")
    r.fail("experts_latent", "needs experts_kernel \"loop\"");
  if (o.experts_sum_float32 && r.get_choice("experts_kernel", "loop", {"loop", "grouped"}) == "grouped")
    r.fail("experts_sum_float32", "needs experts_kernel \"loop\"");
  o.shared_expert = r.get_int("shared_expert", 0, 0, int64_t{1} << 30);
  if (o.shared_expert == 0 && r.has("shared_expert_gate")) r.fail("shared_expert_gate", "needs shared_expert above 0");
  o.shared_expert_gate = r.get_bool("shared_expert_gate", true);
  read_router(r, o);
  o.rope_float32 = r.get_bool("rope_float32", false);
  o.rope_tables_rounded = r.get_bool("rope_tables_rounded", false);
  if (o.rope_tables_rounded && !o.rope_float32) r.fail("rope_tables_rounded", "needs rope_float32 true");
  o.clip_qkv = r.get_number("clip_qkv", 0.0, 0.0, 1e9);
  o.residual_scale = r.get_number("residual_scale", 1.0, -1e6, 1e6);
  o.rotary = r.get_bool("rotary", true);
  o.q_scale_beta = r.get_number("q_scale_beta", 0.0, 0.0, 1e6);
  if (o.q_scale_beta > 0 && !r.has("q_scale_length")) r.fail("q_scale_length", "is required with q_scale_beta");
  if (o.q_scale_beta == 0 && r.has("q_scale_length")) r.fail("q_scale_length", "needs q_scale_beta above 0");
  o.q_scale_length = r.get_int("q_scale_length", 1, 1, int64_t{1} << 30);
  o.rope_interleave = r.get_bool("rope_interleave", false);
  if (!o.rope_interleave && r.has("rope_pairs_kept")) r.fail("rope_pairs_kept", "needs rope_interleave");
  o.rope_pairs_kept = r.get_bool("rope_pairs_kept", false);
  if (o.rope_interleave && !o.rotary) r.fail("rope_interleave", "needs rotary true");
  o.attention_chunk = r.get_int("attention_chunk", 0, 0, int64_t{1} << 30);
  o.qk_l2_norm = r.get_bool("qk_l2_norm", false);
  o.q_temperature = r.get_number("q_temperature", 0.0, 0.0, 1e6);
  if (o.q_temperature == 0 && r.has("q_temperature_floor")) r.fail("q_temperature_floor", "needs q_temperature above 0");
  o.q_temperature_floor = r.get_int("q_temperature_floor", 8192, 1, int64_t{1} << 30);
  // What the latent attention does not compute.
  if (o.mla() && o.qk_norm) r.fail("qk_norm", "is not supported with latent attention (kv_lora_rank)");
  if (o.mla() && o.clip_qkv > 0) r.fail("clip_qkv", "is not supported with latent attention (kv_lora_rank)");
  if (o.mla() && !o.rotary) r.fail("rotary", "false is not supported with latent attention (kv_lora_rank)");
  if (o.mla() && o.attn_sinks) r.fail("attn_sinks", "is not supported with latent attention (kv_lora_rank)");
  if (o.mla() && o.q_scale_beta > 0) r.fail("q_scale_beta", "is not supported with latent attention (kv_lora_rank)");
  if (o.mla() && o.qk_l2_norm) r.fail("qk_l2_norm", "is not supported with latent attention (kv_lora_rank)");
  if (o.mla() && o.q_temperature > 0) r.fail("q_temperature", "is not supported with latent attention (kv_lora_rank)");
  if (o.mla() && o.attn_output_gate) r.fail("attn_output_gate", "is not supported with latent attention (kv_lora_rank)");
  read_gated_deltanet(r, o);
  read_mamba(r, o);
  o.no_mixer = !r.get_bool("mixer", true);
  o.no_mlp = !r.get_bool("mlp", true);
  if (o.no_mixer && o.no_mlp) r.fail("mlp", "false needs a mixer (mixer false and mlp false leave nothing)");
  if ((o.no_mixer || o.no_mlp) && o.norms != NormPlacement::Pre) r.fail(o.no_mixer ? "mixer" : "mlp", "false needs norms \"pre\"");
  if (o.no_mixer && (o.mamba() || o.gated_deltanet() || o.mla()))
    r.fail("mixer", "false cannot be set with mamba_heads, linear_key_heads or kv_lora_rank (the mixers)");
  if (o.no_mlp && o.experts > 0) r.fail("mlp", "false cannot be set with experts");
  if (o.grouped_experts && !o.mlp_gate) r.fail("experts_kernel", "\"grouped\" needs gated experts (mlp_gate true)");
  o.dropout = r.get_number("dropout", 0.0, 0.0, 0.99);
  o.attn_dropout = r.get_number("attn_dropout", o.dropout, 0.0, 0.99);
  const bool plain = (o.norms == NormPlacement::Pre || parallel) && !o.no_mixer && !o.no_mlp && o.residual_scale == 1.0 && !o.mla() && !o.mamba() &&
                     !o.gated_deltanet() && o.attn_softcap == 0 && !o.attn_sinks;
  o.bias_apart = r.get_bool("bias_apart", false);
  if (o.bias_apart && (o.experts > 0 || o.mla() || o.mamba() || o.gated_deltanet()))
    r.fail("bias_apart", "needs attention of its own and one MLP (no experts, latents or other mixer)");
  if (o.norm_scale == RmsScale::None && (!o.norm_center || o.norm_bias || o.qk_norm || o.mla() || o.mamba() || o.gated_deltanet()))
    r.fail("norm_scale", "\"none\" needs norm_center true, norm_bias false, no q/k norms and attention's own mixer (LayerNorms without parameters, OLMo's)");
  if ((o.dropout > 0 || o.attn_dropout > 0) && !plain)
    r.fail(o.dropout > 0 ? "dropout" : "attn_dropout",
           "above 0 needs a plain block: norms \"pre\" or parallel, attention with neither latents, soft caps nor sinks, no other mixer, no residual_scale");
  read_lora(r, o);
  return o;
}

RmsScale read_rms_scale(JsonReader& r, const std::string& key) {
  const std::string s = r.get_choice(key, "after_cast", {"after_cast", "before_cast", "one_plus", "none"});
  return s == "after_cast" ? RmsScale::AfterCast : s == "before_cast" ? RmsScale::BeforeCast : s == "one_plus" ? RmsScale::OnePlus : RmsScale::None;
}

Gpt2BlockOptions read_gpt2_block(JsonReader& r) {
  Gpt2BlockOptions o;
  o.d_model = r.require_int("d_model", 1, int64_t{1} << 30);
  o.n_heads = r.require_int("n_heads", 1, int64_t{1} << 30);
  o.d_ff = r.get_int("d_ff", 4 * o.d_model, 1, 1 << 24);
  o.eps = r.get_number("eps", 1e-5, 1e-12, 1.0);
  o.dropout = r.get_number("dropout", 0.0, 0.0, 0.99);
  o.attn_dropout = r.get_number("attn_dropout", o.dropout, 0.0, 0.99);
  o.gelu_new = r.get_choice("act", "gelu_tanh", {"gelu_tanh", "gelu_new"}) == "gelu_new";
  if (o.d_model % o.n_heads) r.fail("n_heads", detail::concat("must divide d_model (", o.d_model, ")"));
  return o;
}

namespace {
// The adapters' values: rank · (in + out) for each projection adapted.
double lora_values(const LlamaBlockOptions& o) {
  const double d = double(o.d_model), q = double(o.n_heads * o.head_dim), kv = double(o.n_kv_heads * o.head_dim), f = double(o.d_ff);
  double sum = 0;
  for (const std::string& t : o.lora.targets)
    sum += t == "q_proj" ? d + (o.attn_output_gate ? 2 : 1) * q : t == "k_proj" || t == "v_proj" ? d + kv : t == "o_proj" ? q + d : d + f;
  return sum * double(o.lora.rank);
}
}  // namespace

double parameter_values(const LlamaBlockOptions& o) {
  if (o.lora.rank > 0) {
    LlamaBlockOptions base = o;
    base.lora = {};
    return parameter_values(base) + lora_values(o);
  }
  const double d = double(o.d_model), q = double(o.n_heads * o.head_dim), kv = double(o.n_kv_heads * o.head_dim), f = double(o.d_ff);
  const double norms = (o.norms == NormPlacement::Sandwich ? 4 * d : o.norms == NormPlacement::Parallel ? d : 2 * d) * (o.norm_bias ? 2 : 1) *
                       (o.norm_scale == RmsScale::None ? 0 : 1);
  const double qk_norms = !o.qk_norm ? 0 : o.qk_norm_projection || o.qk_norm_each_head ? q + kv : (o.qk_norm_bias ? 4 : 2) * double(o.head_dim);
  const double mlps = o.experts > 0 ? double(o.experts) : 1;
  const double router = o.experts > 0 ? double(o.experts) * (d + (o.router_logit_bias ? 1 : 0)) : 0;
  const double s = double(o.shared_expert), gates = o.mlp_gate ? 3 : 2, biases = o.mlp_gate ? 2 : 1;
  const double shared = o.shared_expert > 0 ? gates * d * s + (o.mlp_bias ? biases * s + d : 0) + (o.shared_expert_gate ? d : 0) : 0;
  const double e = o.experts_latent > 0 ? double(o.experts_latent) : d;  // the experts' width in and out
  const double latent = o.experts_latent > 0 ? 2 * d * e + (o.mlp_bias ? d + e : 0) : 0;
  const double mlp = o.no_mlp ? 0 : mlps * (gates * e * f + (o.mlp_bias ? biases * f + e : 0) + (o.xielu ? 2 : 0)) + router + shared + latent;
  const double mlp_and_norms = mlp + (o.no_mixer || o.no_mlp ? d : norms);
  if (o.no_mixer) return mlp_and_norms;
  if (o.mla()) {  // q_proj (or q_a_proj, its norm, q_b_proj), kv_a_proj_with_mqa, its norm, kv_b_proj, o_proj
    const double H = double(o.n_heads), D = double(o.head_dim), R = double(o.rope_head_dim), V = double(o.v_head_dim);
    const double ql = double(o.q_lora_rank), kl = double(o.kv_lora_rank);
    const double queries = o.q_lora_rank > 0 ? d * ql + ql + ql * H * D + (o.qkv_bias ? ql : 0) : d * H * D;
    const double latent = d * (kl + R) + kl + kl * H * (D - R + V) + (o.qkv_bias ? kl + R : 0);
    return queries + latent + H * V * d + (o.o_bias ? d : 0) + mlp_and_norms;
  }
  if (o.gated_deltanet()) {  // in_proj_qkvz, in_proj_ba, conv1d, dt_bias, A_log, norm, out_proj
    const double keys = double(o.linear_key_heads * o.linear_key_head_dim), values = double(o.linear_value_heads * o.linear_value_head_dim);
    const double hv = double(o.linear_value_heads);
    return d * (2 * keys + 2 * values) + d * 2 * hv + (2 * keys + values) * double(o.linear_conv_kernel) + 2 * hv +
           double(o.linear_value_head_dim) + values * d + mlp_and_norms;
  }
  if (o.mamba()) {  // in_proj, conv1d, dt_bias, A_log, D, norm, out_proj
    const double I = double(o.mamba_heads * o.mamba_head_dim), channels = I + 2 * double(o.mamba_groups * o.mamba_state);
    const double H = double(o.mamba_heads), K = double(o.mamba_conv_kernel);
    return d * (I + channels + H) + (o.mamba_proj_bias ? I + channels + H + d : 0) + channels * K + (o.mamba_conv_bias ? channels : 0) +
           3 * H + I + I * d + mlp_and_norms;
  }
  return d * ((o.attn_output_gate ? 2 : 1) * q + 2 * kv) + q * d + mlp_and_norms + (o.qkv_bias ? (o.attn_output_gate ? 2 : 1) * q + 2 * kv : 0) +
         (o.o_bias ? d : 0) + qk_norms + (o.attn_sinks ? double(o.n_heads) : 0);
}

double parameter_values(const Gpt2BlockOptions& o) {
  const double d = double(o.d_model), f = double(o.d_ff);
  return 4 * d * d + 2 * d * f + 9 * d + f;
}

}  // namespace pipetrain::models
