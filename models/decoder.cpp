#include "models/decoder.h"

#include <cmath>

#include <torch/torch.h>

#include "common/error.h"

namespace pipetrain::models {

namespace {
at::Tensor run(const torch::nn::Linear& l, const at::Tensor& x) { return linear(x, l->weight, l->bias); }

// [B, T, H * D] as [B, H, T, D].
at::Tensor heads(const at::Tensor& x, int64_t H, int64_t D) {
  return x.view({x.size(0), x.size(1), H, D}).transpose(1, 2);
}
// [B, H, T, D] as [B, T, H * D].
at::Tensor merge_heads(const at::Tensor& y) { return y.transpose(1, 2).reshape({y.size(0), y.size(2), -1}); }

// Appends this call's keys and values to the cache; the whole sequence's.
std::pair<at::Tensor, at::Tensor> extend(KvCache* cache, at::Tensor k, at::Tensor v) {
  if (!cache) return {std::move(k), std::move(v)};
  if (cache->k.defined()) {
    k = torch::cat({cache->k, k}, 2);
    v = torch::cat({cache->v, v}, 2);
  }
  cache->k = k;
  cache->v = v;
  return {k, v};
}
}  // namespace

at::Tensor rope_inv_freq(const Rope& rope, int64_t head_dim, at::ScalarType type) {
  // transformers' operations, in their order (Python's `a / t` is t.reciprocal() * a).
  const auto t = type == at::kDouble ? at::kDouble : at::kFloat;
  const auto exponent = torch::arange(0, head_dim, 2, torch::kLong).to(t) / static_cast<double>(head_dim);
  at::Tensor inv = torch::pow(rope.theta, exponent).reciprocal() * 1.0;
  if (rope.type == "linear") return inv / rope.factor;
  if (rope.type != "llama3") return inv;
  const double old = static_cast<double>(rope.original_max_positions);
  const double low_wavelen = old / rope.low_freq_factor, high_wavelen = old / rope.high_freq_factor;
  const at::Tensor wavelen = inv.reciprocal() * (2 * M_PI);
  at::Tensor scaled = torch::where(wavelen > low_wavelen, inv / rope.factor, inv);
  const at::Tensor smooth = (wavelen.reciprocal() * old - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled;
  const at::Tensor medium = (wavelen < high_wavelen).logical_not() * (wavelen > low_wavelen).logical_not();
  return torch::where(medium, smoothed, scaled);
}

std::pair<at::Tensor, at::Tensor> rope_tables(const Rope& rope, int64_t head_dim, int64_t offset, int64_t T,
                                              at::ScalarType type, const at::Device& device) {
  return rope_tables(rope_inv_freq(rope, head_dim, type).to(device), offset, T, type);
}

std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& inv, int64_t offset, int64_t T, at::ScalarType type) {
  const at::Device device = inv.device();
  const at::Tensor positions = torch::arange(offset, offset + T, torch::TensorOptions(torch::kLong).device(device)).to(inv.scalar_type());
  const at::Tensor freqs = positions.unsqueeze(1) * inv.unsqueeze(0);
  const at::Tensor emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().to(type), emb.sin().to(type)};
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                            int64_t window, DropoutImpl* dropout) {
  const int64_t H = q.size(1), KV = k.size(1), Tq = q.size(2), Tk = k.size(2), offset = Tk - Tq;
  PIPETRAIN_CHECK(offset >= 0 && KV > 0 && H % KV == 0);
  const bool gqa = H != KV, windowed = window > 0 && Tk > window;
  const bool explicit_path = dropout && dropout->is_training() && dropout->p() > 0;
  if (!explicit_path && !windowed && (offset == 0 || Tq == 1))
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/Tq > 1, scale, gqa);
  // Query i is position offset + i; it sees keys j <= offset + i (and > offset + i - window).
  const auto longs = torch::TensorOptions(torch::kLong).device(q.device());
  const at::Tensor i = torch::arange(offset, Tk, longs).unsqueeze(1), j = torch::arange(Tk, longs).unsqueeze(0);
  at::Tensor allowed = j <= i;
  if (window > 0) allowed = allowed.logical_and(j > i - window);
  if (!explicit_path) return at::scaled_dot_product_attention(q, k, v, allowed, 0.0, false, scale, gqa);
  const at::Tensor kk = gqa ? k.repeat_interleave(H / KV, 1) : k, vv = gqa ? v.repeat_interleave(H / KV, 1) : v;
  at::Tensor att = torch::matmul(q, kk.transpose(-2, -1)) * scale;
  att = torch::softmax(att.masked_fill(allowed.logical_not(), -INFINITY), -1);
  return torch::matmul(dropout->forward(att), vv);
}

void LlamaAttentionImpl::reset() {
  const int64_t d = o_.d_model, q = o_.n_heads * o_.head_dim, kv = o_.n_kv_heads * o_.head_dim;
  q_proj = register_module("q_proj", torch::nn::Linear(torch::nn::LinearOptions(d, q).bias(o_.qkv_bias)));
  k_proj = register_module("k_proj", torch::nn::Linear(torch::nn::LinearOptions(d, kv).bias(o_.qkv_bias)));
  v_proj = register_module("v_proj", torch::nn::Linear(torch::nn::LinearOptions(d, kv).bias(o_.qkv_bias)));
  o_proj = register_module("o_proj", torch::nn::Linear(torch::nn::LinearOptions(q, d).bias(o_.o_bias)));
  if (o_.qk_norm) {
    q_norm = register_module("q_norm", RmsNorm(std::vector<int64_t>{o_.head_dim}, o_.eps));
    k_norm = register_module("k_norm", RmsNorm(std::vector<int64_t>{o_.head_dim}, o_.eps));
  }
}

void GatedMlpImpl::reset() {
  gate_proj = register_module("gate_proj", torch::nn::Linear(torch::nn::LinearOptions(d_model_, d_ff_).bias(bias_)));
  up_proj = register_module("up_proj", torch::nn::Linear(torch::nn::LinearOptions(d_model_, d_ff_).bias(bias_)));
  down_proj = register_module("down_proj", torch::nn::Linear(torch::nn::LinearOptions(d_ff_, d_model_).bias(bias_)));
}

torch::Tensor GatedMlpImpl::forward(const torch::Tensor& x) {
  return run(down_proj, torch::silu(run(gate_proj, x)) * run(up_proj, x));
}

void LlamaBlockImpl::reset() {
  PIPETRAIN_CHECK(o_.n_kv_heads > 0 && o_.n_heads % o_.n_kv_heads == 0 && o_.head_dim % 2 == 0);
  input_layernorm_ = register_module("input_layernorm", RmsNorm(std::vector<int64_t>{o_.d_model}, o_.eps));
  self_attn_ = register_module("self_attn", LlamaAttention(o_));
  post_attention_layernorm_ = register_module("post_attention_layernorm", RmsNorm(std::vector<int64_t>{o_.d_model}, o_.eps));
  mlp_ = register_module("mlp", GatedMlp(o_.d_model, o_.d_ff, o_.mlp_bias));
}

torch::Tensor LlamaBlockImpl::forward_cached(const torch::Tensor& x, KvCache* cache) {
  const int64_t H = o_.n_heads, KV = o_.n_kv_heads, D = o_.head_dim, T = x.size(1);
  const at::Tensor h = input_layernorm_(x);
  at::Tensor q = heads(run(self_attn_->q_proj, h), H, D), k = heads(run(self_attn_->k_proj, h), KV, D);
  const at::Tensor v = heads(run(self_attn_->v_proj, h), KV, D);
  if (o_.qk_norm) {  // over each head's values: the same whether heads are split before or after
    q = self_attn_->q_norm(q);
    k = self_attn_->k_norm(k);
  }
  const int64_t offset = cache ? cache->length() : 0;
  if (!rope_inv_.defined() || rope_inv_.device() != q.device() || rope_type_ != q.scalar_type()) {
    rope_inv_ = rope_inv_freq(o_.rope, D, q.scalar_type()).to(q.device());
    rope_type_ = q.scalar_type();
  }
  const auto [cos, sin] = rope_tables(rope_inv_, offset, T, q.scalar_type());
  q = apply_rope(q, cos, sin);
  k = apply_rope(k, cos, sin);
  const auto [keys, values] = extend(cache, k, v);
  const at::Tensor y = causal_attention(q, keys, values, 1.0 / std::sqrt(static_cast<double>(D)), o_.sliding_window, nullptr);
  const at::Tensor h1 = x + run(self_attn_->o_proj, merge_heads(y));
  return h1 + mlp_(post_attention_layernorm_(h1));
}

void Gpt2AttentionImpl::reset() {
  c_attn = register_module("c_attn", torch::nn::Linear(d_model_, 3 * d_model_));
  c_proj = register_module("c_proj", torch::nn::Linear(d_model_, d_model_));
}

void Gpt2MlpImpl::reset() {
  c_fc = register_module("c_fc", torch::nn::Linear(d_model_, d_ff_));
  c_proj = register_module("c_proj", torch::nn::Linear(d_ff_, d_model_));
}

void Gpt2BlockImpl::reset() {
  PIPETRAIN_CHECK(o_.n_heads > 0 && o_.d_model % o_.n_heads == 0);
  ln_1_ = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o_.d_model}).eps(o_.eps)));
  attn_ = register_module("attn", Gpt2Attention(o_.d_model));
  ln_2_ = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o_.d_model}).eps(o_.eps)));
  mlp_ = register_module("mlp", Gpt2Mlp(o_.d_model, o_.d_ff));
  // Each dropout has its own stream: stream_ is the block's first of three.
  attn_drop_ = register_module("attn_drop", Dropout(o_.attn_dropout, stream_));
  resid_drop_ = register_module("resid_drop", Dropout(o_.dropout, stream_ + 1));
  mlp_drop_ = register_module("mlp_drop", Dropout(o_.dropout, stream_ + 2));
}

torch::Tensor Gpt2BlockImpl::forward_cached(const torch::Tensor& x, KvCache* cache) {
  const int64_t H = o_.n_heads, D = o_.d_model / H;
  const auto qkv = run(attn_->c_attn, ln_1_(x)).split(o_.d_model, 2);
  const auto [k, v] = extend(cache, heads(qkv[1], H, D), heads(qkv[2], H, D));
  const at::Tensor y = causal_attention(heads(qkv[0], H, D), k, v, 1.0 / std::sqrt(static_cast<double>(D)), 0, attn_drop_.get());
  const at::Tensor h = x + resid_drop_(run(attn_->c_proj, merge_heads(y)));
  return h + mlp_drop_(run(mlp_->c_proj, torch::gelu(run(mlp_->c_fc, ln_2_(h)), "tanh")));
}

}  // namespace pipetrain::models
