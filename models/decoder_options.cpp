// The decoder blocks' arguments as a layer list spells them (models/decoder.h).
#include <cmath>

#include "common/error.h"
#include "common/strings.h"
#include "models/decoder.h"

namespace pipetrain::models {

namespace {
// rope_theta, and rope_scaling as transformers writes it ({"rope_type": "linear" | "llama3",
// "factor", ...}); other kinds are refused by name.
Rope read_rope(JsonReader& r) {
  Rope rope;
  rope.theta = r.get_number("rope_theta", 10000.0, 1.0, 1e12);
  if (!r.has("rope_scaling")) return rope;
  JsonReader s = r.child("rope_scaling");
  rope.type = s.get_choice("rope_type", "default", {"default", "linear", "llama3"});
  if (rope.type != "default") rope.factor = s.get_number("factor", 1.0, 1e-6, 1e6);
  if (rope.type == "llama3") {
    rope.low_freq_factor = s.get_number("low_freq_factor", 1.0, 1e-6, 1e6);
    rope.high_freq_factor = s.get_number("high_freq_factor", 4.0, 1e-6, 1e6);
    if (rope.high_freq_factor <= rope.low_freq_factor) s.fail("high_freq_factor", "must exceed low_freq_factor");
    rope.original_max_positions = s.get_int("original_max_position_embeddings", 8192, 1, int64_t{1} << 30);
  }
  s.finish();
  return rope;
}
}  // namespace

LlamaBlockOptions read_llama_block(JsonReader& r) {
  LlamaBlockOptions o;
  o.d_model = r.require_int("d_model", 1, int64_t{1} << 30);
  o.n_heads = r.require_int("n_heads", 1, int64_t{1} << 30);
  o.n_kv_heads = r.get_int("n_kv_heads", o.n_heads, 1, o.n_heads);
  if (o.n_heads % o.n_kv_heads) r.fail("n_kv_heads", detail::concat("must divide n_heads (", o.n_heads, ")"));
  if (!r.has("head_dim") && o.d_model % o.n_heads) r.fail("n_heads", detail::concat("must divide d_model (", o.d_model, "), or give head_dim"));
  o.head_dim = r.get_int("head_dim", o.d_model / o.n_heads, 2, 1 << 16);
  if (o.head_dim % 2) r.fail("head_dim", "must be even (rotary positions turn pairs of values)");
  o.d_ff = r.require_int("d_ff", 1, int64_t{1} << 30);
  o.eps = r.get_number("eps", 1e-6, 1e-12, 1.0);
  o.rope = read_rope(r);
  o.qkv_bias = r.get_bool("qkv_bias", false);
  o.o_bias = r.get_bool("o_bias", false);
  o.mlp_bias = r.get_bool("mlp_bias", false);
  o.qk_norm = r.get_bool("qk_norm", false);
  o.sliding_window = r.get_int("sliding_window", 0, 0, int64_t{1} << 30);
  return o;
}

Gpt2BlockOptions read_gpt2_block(JsonReader& r) {
  Gpt2BlockOptions o;
  o.d_model = r.require_int("d_model", 1, int64_t{1} << 30);
  o.n_heads = r.require_int("n_heads", 1, int64_t{1} << 30);
  o.d_ff = r.get_int("d_ff", 4 * o.d_model, 1, 1 << 24);
  o.eps = r.get_number("eps", 1e-5, 1e-12, 1.0);
  o.dropout = r.get_number("dropout", 0.0, 0.0, 0.99);
  o.attn_dropout = r.get_number("attn_dropout", o.dropout, 0.0, 0.99);
  if (o.d_model % o.n_heads) r.fail("n_heads", detail::concat("must divide d_model (", o.d_model, ")"));
  return o;
}

double parameter_values(const LlamaBlockOptions& o) {
  const double d = double(o.d_model), q = double(o.n_heads * o.head_dim), kv = double(o.n_kv_heads * o.head_dim), f = double(o.d_ff);
  return d * (q + 2 * kv) + q * d + 3 * d * f + 2 * d + (o.qkv_bias ? q + 2 * kv : 0) + (o.o_bias ? d : 0) +
         (o.mlp_bias ? 2 * f + d : 0) + (o.qk_norm ? 2 * double(o.head_dim) : 0);
}

double parameter_values(const Gpt2BlockOptions& o) {
  const double d = double(o.d_model), f = double(o.d_ff);
  return 4 * d * d + 2 * d * f + 9 * d + f;
}

}  // namespace pipetrain::models
