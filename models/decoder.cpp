#include "models/decoder.h"

#include <algorithm>
#include <cmath>

#include <torch/torch.h>

#include "common/error.h"
#include "common/replayable.h"

namespace pipetrain::models {

namespace {
// A block's projection (models/lora.h: with its adapter where it has one).
at::Tensor run(const torch::nn::Linear& l, const at::Tensor& x) { return project(l, x); }

// [B, T, H * D] as [B, H, T, D].
at::Tensor heads(const at::Tensor& x, int64_t H, int64_t D) {
  return x.view({x.size(0), x.size(1), H, D}).transpose(1, 2);
}
// [B, H, T, D] as [B, T, H * D].
at::Tensor merge_heads(const at::Tensor& y) { return y.transpose(1, 2).reshape({y.size(0), y.size(2), -1}); }

// Drops from `cache` the positions no later query of a layer with `window` (or `chunk`) sees:
// a query sees the window's last positions, so the next needs the last window - 1 kept; or those
// of its chunk, so the kept ones start where the current chunk does. The masks of causal_attention
// are relative to the first key kept (a chunk's boundaries too, the dropped being whole chunks), so
// the attention over what is kept is the attention over all (IncrementalLayers.WindowedLayersKeep*).
void drop_unseen(KvCache* cache, int64_t window, int64_t chunk) {
  if (!cache || !cache->k.defined() || (window > 0) == (chunk > 0)) return;  // neither, or both: keep all
  const int64_t kept = cache->k.size(2), total = cache->length();
  const int64_t keep = window > 0 ? std::min(kept, window - 1) : std::min(kept, total % chunk);
  if (keep == kept) return;
  cache->k = cache->k.narrow(2, kept - keep, keep);  // a view: the next call's cat copies it out
  cache->v = cache->v.narrow(2, kept - keep, keep);
  cache->dropped += kept - keep;
}

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

// The first n values (all: n 0) as interleaved pairs (x0, x1), (x2, x3), … made halves: the even
// values, then the odd ones; and back. The values past n pass through.
at::Tensor deinterleave(const at::Tensor& x, int64_t n = 0) {
  const int64_t D = x.size(-1);
  n = n > 0 ? n : D;
  const at::Tensor r = x.narrow(-1, 0, n), y = torch::cat({r.slice(-1, 0, std::nullopt, 2), r.slice(-1, 1, std::nullopt, 2)}, -1);
  return n == D ? y : torch::cat({y, x.narrow(-1, n, D - n)}, -1);
}
at::Tensor interleave(const at::Tensor& x, int64_t n = 0) {
  const int64_t D = x.size(-1);
  n = n > 0 ? n : D;
  const at::Tensor y = torch::stack({x.narrow(-1, 0, n / 2), x.narrow(-1, n / 2, n / 2)}, -1).flatten(-2);
  return n == D ? y : torch::cat({y, x.narrow(-1, n, D - n)}, -1);
}
}  // namespace

int64_t rotary_dim(const Rope& rope, int64_t head_dim) { return static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial); }

bool rope_long(const Rope& rope, int64_t end) { return rope.type == "longrope" && end > rope.original_max_positions; }

int64_t rope_dynamic_length(const Rope& rope, int64_t end) {
  return rope.type == "dynamic" ? std::max(end, rope.original_max_positions) : 0;
}

namespace {
// yarn's inverse frequencies from the default kind's powers: a ramp over the pairs between the
// dimensions where beta_fast and beta_slow rotations fit in the original context takes each pair
// from the original frequency (extrapolation) to the one divided by factor (interpolation).
at::Tensor yarn_inv_freq(const Rope& rope, const at::Tensor& pos_freqs, int64_t dim) {
  auto correction_dim = [&](double rotations) {
    return static_cast<double>(dim) * std::log(static_cast<double>(rope.original_max_positions) / (rotations * 2 * M_PI)) /
           (2 * std::log(rope.theta));
  };
  double low = correction_dim(rope.beta_fast), high = correction_dim(rope.beta_slow);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  const at::Tensor ramp = ((torch::arange(dim / 2, pos_freqs.options()) - low) / (high - low)).clamp(0, 1);
  const at::Tensor extrapolation = pos_freqs.reciprocal() * 1.0, interpolation = (pos_freqs * rope.factor).reciprocal() * 1.0;
  const at::Tensor keep = 1 - ramp;
  return interpolation * (1 - keep) + extrapolation * keep;
}
}  // namespace

at::Tensor rope_inv_freq(const Rope& rope, int64_t head_dim, at::ScalarType type, bool long_factors, int64_t dynamic_length) {
  // transformers' operations, in their order (Python's `a / t` is t.reciprocal() * a).
  const auto t = type == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t dim = rotary_dim(rope, head_dim);
  const auto exponent = torch::arange(0, dim, 2, torch::kLong).to(t) / static_cast<double>(dim);
  if (rope.type == "dynamic" && dynamic_length > rope.original_max_positions) {
    // transformers' _compute_dynamic_ntk_parameters: its sequence length a tensor, so the base is
    // one of type t (float32 where transformers runs it) before it raises the exponents.
    const at::Tensor length = torch::scalar_tensor(dynamic_length, torch::kLong).to(t);
    const at::Tensor base =
        ((length * rope.factor) / static_cast<double>(rope.original_max_positions) - (rope.factor - 1))
            .pow(static_cast<double>(dim) / static_cast<double>(dim - 2)) * rope.theta;
    return torch::pow(base, exponent).reciprocal() * 1.0;
  }
  const at::Tensor powers = torch::pow(rope.theta, exponent);
  if (rope.type == "yarn") return yarn_inv_freq(rope, powers, dim);
  if (rope.type == "longrope") {
    const std::vector<double>& f = long_factors ? rope.long_factor : rope.short_factor;
    PIPETRAIN_CHECK(static_cast<int64_t>(f.size()) == dim / 2);
    return (torch::tensor(f, torch::kDouble).to(t) * powers).reciprocal() * 1.0;
  }
  at::Tensor inv = powers.reciprocal() * 1.0;
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
  const at::Tensor inv =
      rope_inv_freq(rope, head_dim, type, rope_long(rope, offset + T), rope_dynamic_length(rope, offset + T)).to(device);
  return rope_tables(inv, offset, T, type, rope.attention_factor);
}

std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& inv, int64_t offset, int64_t T, at::ScalarType type,
                                              double attention_factor) {
  const at::Device device = inv.device();
  const at::Tensor positions = torch::arange(offset, offset + T, torch::TensorOptions(torch::kLong).device(device)).to(inv.scalar_type());
  const at::Tensor freqs = positions.unsqueeze(1) * inv.unsqueeze(0);
  const at::Tensor emb = torch::cat({freqs, freqs}, -1);
  if (attention_factor == 1) return {emb.cos().to(type), emb.sin().to(type)};
  return {(emb.cos() * attention_factor).to(type), (emb.sin() * attention_factor).to(type)};
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t D = x.size(-1), rot = cos.size(-1), half = rot / 2;
  const at::Tensor r = rot == D ? x : x.narrow(-1, 0, rot);
  const at::Tensor rotated = torch::cat({-r.narrow(-1, half, half), r.narrow(-1, 0, half)}, -1);
  const at::Tensor y = r * cos + rotated * sin;
  return rot == D ? y : torch::cat({y, x.narrow(-1, rot, D - rot)}, -1);
}

void LlamaAttentionImpl::reset() {
  const int64_t d = o_.d_model, q = o_.n_heads * o_.head_dim, kv = o_.n_kv_heads * o_.head_dim;
  // With attn_output_gate, each head's queries then its gate (Qwen3-Next's).
  q_proj = register_module("q_proj", lora_linear(o_.lora, "q_proj", d, o_.attn_output_gate ? 2 * q : q, o_.qkv_bias));
  k_proj = register_module("k_proj", lora_linear(o_.lora, "k_proj", d, kv, o_.qkv_bias));
  v_proj = register_module("v_proj", lora_linear(o_.lora, "v_proj", d, kv, o_.qkv_bias));
  o_proj = register_module("o_proj", lora_linear(o_.lora, "o_proj", q, d, o_.o_bias));
  if (o_.attn_sinks) sinks = register_parameter("sinks", torch::zeros({o_.n_heads}));
  if (o_.qk_norm) {
    // Over the projection (OLMo 2's), each head with one weight (Qwen3's) or its own (Command R+'s);
    // torch's LayerNorms where the block's are (norm_bias: Phi's, StableLM's).
    auto shape = [&](int64_t heads, int64_t all) {
      return o_.qk_norm_projection ? std::vector<int64_t>{all} : o_.qk_norm_each_head ? std::vector<int64_t>{heads, o_.head_dim} : std::vector<int64_t>{o_.head_dim};
    };
    q_norm = register_module("q_norm", RmsNorm(shape(o_.n_heads, q), o_.eps, o_.norm_scale, o_.norm_center, 1, o_.qk_norm_bias,
                                                  o_.norm_bias));
    k_norm = register_module("k_norm", RmsNorm(shape(o_.n_kv_heads, kv), o_.eps, o_.norm_scale, o_.norm_center, 1, o_.qk_norm_bias,
                                                  o_.norm_bias));
  }
}

void MlaAttentionImpl::reset() {
  const int64_t d = o_.d_model, H = o_.n_heads;
  auto lin = [&](const char* name, int64_t in, int64_t out, bool bias) {
    return register_module(name, torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias)));
  };
  if (o_.q_lora_rank > 0) {
    q_a_proj = lin("q_a_proj", d, o_.q_lora_rank, o_.qkv_bias);
    q_a_layernorm = register_module("q_a_layernorm", RmsNorm(std::vector<int64_t>{o_.q_lora_rank}, o_.latent_eps, o_.norm_scale));
    q_b_proj = lin("q_b_proj", o_.q_lora_rank, H * o_.head_dim, false);
  } else {
    q_proj = lin("q_proj", d, H * o_.head_dim, false);
  }
  kv_a_proj_with_mqa = lin("kv_a_proj_with_mqa", d, o_.kv_lora_rank + o_.rope_head_dim, o_.qkv_bias);
  kv_a_layernorm = register_module("kv_a_layernorm", RmsNorm(std::vector<int64_t>{o_.kv_lora_rank}, o_.latent_eps, o_.norm_scale));
  kv_b_proj = lin("kv_b_proj", o_.kv_lora_rank, H * (o_.head_dim - o_.rope_head_dim + o_.v_head_dim), false);
  o_proj = lin("o_proj", H * o_.v_head_dim, d, o_.o_bias);
}

void RouterImpl::reset() {
  weight = register_parameter("weight", torch::empty({experts_, d_model_}));
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));  // torch's Linear's
  if (logit_bias_) bias = register_parameter("bias", torch::zeros({experts_}));
  if (correction_) e_score_correction_bias = register_buffer("e_score_correction_bias", torch::zeros({experts_}));
}

void XieluImpl::reset() {
  alpha_p = register_parameter("alpha_p", torch::log(torch::expm1(torch::full({1}, 0.8))));
  alpha_n = register_parameter("alpha_n", torch::log(torch::expm1(torch::full({1}, 0.8 - 0.5))));
  beta = register_buffer("beta", torch::full({}, 0.5));
  eps = register_buffer("eps", torch::full({}, -1e-6));
}

torch::Tensor XieluImpl::forward(const torch::Tensor& x) const {
  const at::Tensor a = torch::softplus(alpha_p), b = beta + torch::softplus(alpha_n);
  return torch::where(x > 0, a * x * x + beta * x, (torch::expm1(torch::minimum(x, eps)) - x) * b + beta * x);
}

void GatedMlpImpl::reset() {
  if (gated_) gate_proj = register_module("gate_proj", lora_linear(lora_, "gate_proj", d_model_, d_ff_, bias_));
  up_proj = register_module("up_proj", lora_linear(lora_, "up_proj", d_model_, d_ff_, bias_));
  down_proj = register_module("down_proj", lora_linear(lora_, "down_proj", d_ff_, d_model_, bias_));
  if (xielu_) act_fn = register_module("act_fn", Xielu());
}

at::Tensor GatedMlpImpl::activate(const at::Tensor& gate, const at::Tensor& up) const {
  if (oai_alpha_ > 0) {  // GPT-OSS's clamped SwiGLU
    const at::Tensor g = gate.clamp_max(oai_limit_);
    return (up.clamp(-oai_limit_, oai_limit_) + 1) * (g * torch::sigmoid(g * oai_alpha_));
  }
  return act(gate) * up;
}

at::Tensor GatedMlpImpl::act(const at::Tensor& x) const {
  if (xielu_) return act_fn->forward(x);
  return gelu_ != Gelu::None ? apply_gelu(gelu_, x) : relu2_ ? torch::square(torch::relu(x)) : torch::silu(x);
}

at::Tensor apply_gelu(Gelu g, const at::Tensor& x) {
  switch (g) {
    case Gelu::None: return x;
    case Gelu::Tanh: return torch::gelu(x, "tanh");
    case Gelu::Erf: return torch::gelu(x);
    case Gelu::New: return 0.5 * x * (1.0 + torch::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * torch::pow(x, 3.0))));
    case Gelu::Fast: return 0.5 * x * (1.0 + torch::tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)));
  }
  return x;
}

torch::Tensor GatedMlpImpl::forward(const torch::Tensor& x) {
  // GPT-OSS's and Falcon's in transformers' operations: each product, then its bias.
  const bool apart = oai_alpha_ > 0 || bias_apart_;
  auto p = [&](const torch::nn::Linear& l, const at::Tensor& in) { return project(l, in, apart); };
  if (!gated_) return p(down_proj, act(p(up_proj, x)));
  return p(down_proj, activate(p(gate_proj, x), p(up_proj, x)));
}

void MoeImpl::reset() {
  gate = register_module("gate", Router(o_.experts, o_.d_model, o_.router_bias, o_.router_logit_bias));
  experts = register_module("experts", torch::nn::ModuleList());
  const int64_t in = o_.experts_latent > 0 ? o_.experts_latent : o_.d_model;  // Nemotron-H's latent experts
  if (o_.experts_latent > 0) {
    fc1_latent_proj = register_module("fc1_latent_proj", torch::nn::Linear(torch::nn::LinearOptions(o_.d_model, in).bias(o_.mlp_bias)));
    fc2_latent_proj = register_module("fc2_latent_proj", torch::nn::Linear(torch::nn::LinearOptions(in, o_.d_model).bias(o_.mlp_bias)));
  }
  for (int64_t e = 0; e < o_.experts; ++e)
    experts->push_back(GatedMlp(in, o_.d_ff, o_.mlp_bias, o_.gelu, o_.swiglu_alpha, o_.swiglu_limit, o_.relu2, o_.mlp_gate));
  if (o_.shared_expert > 0) {
    shared_expert = register_module("shared_expert", GatedMlp(o_.d_model, o_.shared_expert, o_.mlp_bias, o_.gelu, o_.swiglu_alpha,
                                                              o_.swiglu_limit, o_.relu2, o_.mlp_gate));
    if (o_.shared_expert_gate)
      shared_expert_gate =
          register_module("shared_expert_gate", torch::nn::Linear(torch::nn::LinearOptions(o_.d_model, 1).bias(false)));
  }
}

namespace {
// Of group_scores [N, groups], the experts of each token's `best` groups of highest score, as a
// mask [N, experts] (transformers' DeepSeek routers' operations).
at::Tensor best_groups(const at::Tensor& group_scores, int64_t best, int64_t experts) {
  const int64_t G = group_scores.size(1);
  const at::Tensor groups = std::get<1>(group_scores.topk(best, -1, /*largest=*/true, /*sorted=*/false));
  const at::Tensor mask = torch::zeros_like(group_scores).scatter_(1, groups, 1.0);
  return mask.unsqueeze(-1).expand({-1, G, experts / G}).reshape({-1, experts}).to(torch::kBool);
}
}  // namespace

std::pair<at::Tensor, at::Tensor> MoeImpl::route(const at::Tensor& h) {
  // The logits from both operands in float32 with router_float32 in lower precisions; the scores
  // below from them in float32 at least.
  const bool wide = o_.router_float32 && c10::isReducedFloatingType(h.scalar_type());
  const at::Tensor bias = gate->bias.defined() && wide ? gate->bias.to(torch::kFloat) : gate->bias;
  const at::Tensor logits = wide ? linear(h.to(torch::kFloat), gate->weight.to(torch::kFloat), bias) : linear(h, gate->weight, bias);
  const at::Tensor logits32 = c10::isReducedFloatingType(logits.scalar_type()) ? logits.to(torch::kFloat) : logits;
  if (o_.router_top_softmax) {  // GPT-OSS's: the chosen experts' logits' softmax, in their type
    auto [values, chosen] = logits.topk(o_.experts_per_token, -1);
    at::Tensor top = torch::softmax(values, -1);
    if (o_.routed_scale != 1) top = top * o_.routed_scale;
    return {top, chosen};
  }
  if (o_.router_top_sigmoid) {  // Llama 4's: the chosen experts' logits' sigmoid, in float32, then the model's type
    auto [values, chosen] = logits.topk(o_.experts_per_token, -1);
    at::Tensor top = (c10::isReducedFloatingType(values.scalar_type()) ? values.to(torch::kFloat) : values).sigmoid();
    if (o_.routed_scale != 1) top = top * o_.routed_scale;
    return {top.to(h.scalar_type()), chosen};
  }
  if (!o_.router_sigmoid && o_.expert_groups > 1) {
    // DeepSeek-V2's group_limited_greedy: the best experts of the groups of highest best score.
    const at::Tensor scores = torch::softmax(logits32, -1);
    const at::Tensor keep = best_groups(scores.view({-1, o_.expert_groups, o_.experts / o_.expert_groups}).amax(-1),
                                        o_.groups_per_token, o_.experts);
    auto [top, chosen] = scores.masked_fill(keep.logical_not(), 0.0).topk(o_.experts_per_token, -1, /*largest=*/true, /*sorted=*/false);
    if (o_.normalize_experts) top = top / top.sum(-1, /*keepdim=*/true);
    top = top * o_.routed_scale;
    if (o_.router_cast) top = top.to(h.scalar_type());
    return {top, chosen};
  }
  if (!o_.router_sigmoid) {
    auto [top, chosen] = torch::softmax(logits32, -1).topk(o_.experts_per_token, -1);
    if (o_.normalize_experts) top = top / top.sum(-1, /*keepdim=*/true);
    if (o_.routed_scale != 1) top = top * o_.routed_scale;
    if (o_.router_cast) top = top.to(h.scalar_type());
    return {top, chosen};
  }
  // DeepSeek-V3's, in transformers' operations: the experts chosen by the scores plus the
  // correction bias, among those of the groups_per_token groups whose two best sum highest.
  const at::Tensor scores = logits32.sigmoid();
  at::Tensor choice = o_.router_bias ? scores + gate->e_score_correction_bias : scores;
  if (o_.expert_groups > 1) {
    const at::Tensor group_scores = std::get<0>(choice.view({-1, o_.expert_groups, o_.experts / o_.expert_groups}).topk(2, -1)).sum(-1);
    choice = choice.masked_fill(best_groups(group_scores, o_.groups_per_token, o_.experts).logical_not(), -INFINITY);
  }
  const at::Tensor chosen = std::get<1>(choice.topk(o_.experts_per_token, -1, /*largest=*/true, /*sorted=*/false));
  at::Tensor top = scores.gather(1, chosen);
  if (o_.normalize_experts) top = top / (top.sum(-1, /*keepdim=*/true) + 1e-20);
  top = top * o_.routed_scale;
  if (o_.router_cast) top = top.to(h.scalar_type());
  return {top, chosen};
}

torch::Tensor MoeImpl::forward(const torch::Tensor& x) {
  const at::Tensor h = x.reshape({-1, x.size(-1)});
  auto [top, chosen] = route(h);
  const std::string why = o_.grouped_experts ? why_not_grouped(h) : "";
  if (!why.empty()) note_not_replayable(why.c_str());
  at::Tensor out = o_.grouped_experts && why.empty() ? grouped(h, top, chosen)
                   : o_.experts_latent > 0          ? run(fc2_latent_proj, looped(run(fc1_latent_proj, h), top, chosen))
                                                    : looped(h, top, chosen);
  // In this order: it fixes the order in which the backward sums into h (bench/results/hf_parity.txt).
  if (shared_expert && shared_expert_gate) out = out + torch::sigmoid(run(shared_expert_gate, h)) * shared_expert->forward(h);
  else if (shared_expert) out = out + shared_expert->forward(h);
  return out.view(x.sizes());
}

at::Tensor MoeImpl::looped(const at::Tensor& h, const at::Tensor& top, const at::Tensor& chosen) {
  note_not_replayable(
      "a mixture of experts reads its routing on the host (each expert's tokens) every forward; experts_kernel \"grouped\" does not");
  // Summed in float32 with experts_sum_float32 in lower precisions, then cast back (below).
  const bool wide = o_.experts_sum_float32 && c10::isReducedFloatingType(h.scalar_type());
  at::Tensor out = wide ? torch::zeros_like(h, torch::kFloat) : torch::zeros_like(h);
  // Each expert's tokens in transformers' order: by their rank among the token's choices, then
  // by position (the rows of a GEMM; the sums into `out` go expert by expert). The choices in
  // that order (rank * N + token), sorted stably by expert; the counts read once.
  const int64_t N = h.size(0);
  const at::Tensor flat = chosen.t().reshape({-1});
  const at::Tensor order = torch::argsort(flat, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  const at::Tensor counts = torch::bincount(flat, {}, o_.experts).cpu();
  const int64_t* count = counts.data_ptr<int64_t>();
  for (int64_t e = 0, begin = 0; e < o_.experts; begin += count[e], ++e) {
    if (count[e] == 0) continue;
    const at::Tensor picks = order.narrow(0, begin, count[e]);
    const at::Tensor rank = picks.div(N, "floor"), token = picks.remainder(N);
    const at::Tensor in = h.index_select(0, token), weight = top.index({token, rank}).unsqueeze(1);
    GatedMlpImpl& expert = *experts[e]->as<GatedMlpImpl>();
    const at::Tensor y = o_.router_scales_input ? expert.forward(in * weight) : expert.forward(in) * weight;
    out.index_add_(0, token, y.to(out.scalar_type()));
  }
  return wide ? out.to(h.scalar_type()) : out;
}

void LlamaBlockImpl::reset() {
  PIPETRAIN_CHECK(o_.n_kv_heads > 0 && o_.n_heads % o_.n_kv_heads == 0 && (o_.mla() ? o_.rope_head_dim : o_.head_dim) % 2 == 0);
  PIPETRAIN_CHECK(!o_.mla() || (o_.n_kv_heads == o_.n_heads && o_.rope_head_dim > 0 && o_.rope_head_dim <= o_.head_dim && o_.v_head_dim > 0));
  auto norm = [&](const char* name) {
    return register_module(name, RmsNorm(std::vector<int64_t>{o_.d_model}, o_.eps, o_.norm_scale, o_.norm_center, 0, o_.norm_bias));
  };
  o_.lora.stream = stream_ + 3;  // the adapters' dropouts after the block's three
  if (o_.dropout > 0 || o_.attn_dropout > 0) {  // each its own stream, as gpt2_block's
    attn_drop_ = register_module("attn_drop", Dropout(o_.attn_dropout, stream_));
    resid_drop_ = register_module("resid_drop", Dropout(o_.dropout, stream_ + 1));
    mlp_drop_ = register_module("mlp_drop", Dropout(o_.dropout, stream_ + 2));
  }
  if (o_.norms != NormPlacement::Post && !o_.no_mixer) input_layernorm_ = norm("input_layernorm");
  if (o_.no_mixer) {  // an MLP alone (Nemotron-H's)
  } else if (o_.gated_deltanet()) {
    linear_attn_ = register_module("linear_attn", GatedDeltaNet(o_));
  } else if (o_.mamba()) {
    mamba_ = register_module("mamba", Mamba2Mixer(o_));
  } else if (o_.mla()) {
    mla_ = register_module("self_attn", MlaAttention(o_));
  } else {
    self_attn_ = register_module("self_attn", LlamaAttention(o_));
  }
  if (o_.no_mlp) return;  // a mixer alone (Nemotron-H's)
  if (o_.norms != NormPlacement::Parallel) post_attention_layernorm_ = norm("post_attention_layernorm");  // ParallelTwo's MLP's
  if (o_.norms == NormPlacement::Sandwich) pre_feedforward_layernorm_ = norm("pre_feedforward_layernorm");
  if (o_.experts > 0) moe_ = register_module("mlp", Moe(o_));
  else mlp_ = register_module("mlp", GatedMlp(o_.d_model, o_.d_ff, o_.mlp_bias, o_.gelu, o_.swiglu_alpha, o_.swiglu_limit, o_.relu2, o_.mlp_gate, o_.xielu,
                                               o_.bias_apart, o_.lora));
  if (o_.norms == NormPlacement::Post || o_.norms == NormPlacement::Sandwich) post_feedforward_layernorm_ = norm("post_feedforward_layernorm");
}

std::pair<at::Tensor, at::Tensor> LlamaBlockImpl::rotate(at::Tensor q, at::Tensor k, int64_t head_dim, int64_t offset,
                                                          KvCache* cache) {
  const int64_t T = q.size(2);
  const int64_t dynamic_length = rope_dynamic_length(o_.rope, offset + T);
  if (!rope_inv_.defined() || rope_inv_.device() != q.device() || rope_type_ != q.scalar_type() ||
      rope_dynamic_length_ != dynamic_length) {
    rope_inv_ = rope_inv_freq(o_.rope, head_dim, q.scalar_type(), false, dynamic_length).to(q.device());
    rope_dynamic_length_ = dynamic_length;
    if (o_.rope.type == "longrope") rope_inv_long_ = rope_inv_freq(o_.rope, head_dim, q.scalar_type(), true).to(q.device());
    rope_type_ = q.scalar_type();
  }
  const bool long_factors = rope_long(o_.rope, offset + T);
  if (cache && offset > 0 && long_factors != rope_long(o_.rope, offset)) cache->stale = true;
  const at::Tensor& inv = long_factors ? rope_inv_long_ : rope_inv_;
  const at::ScalarType type = q.scalar_type(), tables = o_.rope_float32 && c10::isReducedFloatingType(type) ? at::kFloat : type;
  auto [cos, sin] = rope_tables(inv, offset, T, tables, o_.rope.attention_factor);
  if (o_.rope_tables_rounded && tables != type) std::tie(cos, sin) = std::make_pair(cos.to(type).to(tables), sin.to(type).to(tables));
  return {apply_rope(q, cos, sin).to(type), apply_rope(k, cos, sin).to(type)};
}

at::Tensor LlamaBlockImpl::attention(const at::Tensor& h, KvCache* cache) {
  if (o_.mla()) return latent_attention(h, cache);
  const int64_t H = o_.n_heads, KV = o_.n_kv_heads, D = o_.head_dim;
  const auto run = [&](const torch::nn::Linear& l, const at::Tensor& x) { return project(l, x, o_.bias_apart); };
  at::Tensor qp = run(self_attn_->q_proj, h), kp = run(self_attn_->k_proj, h), gate;
  if (o_.attn_output_gate) {  // Qwen3-Next's: each head's queries, then its gate
    const auto parts = qp.view({h.size(0), h.size(1), H, 2 * D}).chunk(2, -1);
    qp = parts[0].reshape({h.size(0), h.size(1), H * D});
    gate = parts[1].transpose(1, 2);  // [B, H, T, D], as attention's output
  }
  if (o_.qk_norm && o_.qk_norm_projection) {  // OLMo 2's: over the whole projection
    qp = self_attn_->q_norm(qp);
    kp = self_attn_->k_norm(kp);
  }
  at::Tensor vp = run(self_attn_->v_proj, h);
  if (o_.clip_qkv > 0) {  // OLMoE's, after the projections' norms
    qp = qp.clamp(-o_.clip_qkv, o_.clip_qkv);
    kp = kp.clamp(-o_.clip_qkv, o_.clip_qkv);
    vp = vp.clamp(-o_.clip_qkv, o_.clip_qkv);
  }
  at::Tensor q = heads(qp, H, D), k = heads(kp, KV, D);
  const at::Tensor v = heads(vp, KV, D);
  // Over each head's values, [B, T, H, D] where each head has its own weight (Command R+'s).
  auto per_head = [&](RmsNorm& n, const at::Tensor& x) { return o_.qk_norm_each_head ? n(x.transpose(1, 2)).transpose(1, 2) : n(x); };
  if (o_.qk_norm && !o_.qk_norm_projection && !o_.qk_norm_after_rope) {  // Qwen3's, Gemma 3's, Command R+'s
    q = per_head(self_attn_->q_norm, q);
    k = per_head(self_attn_->k_norm, k);
  }
  const int64_t offset = cache ? cache->length() : 0;
  if (o_.rotary && o_.rope_interleave) {  // Llama 4's, GLM-4's, Ernie 4.5's: interleaved pairs (of the rotated values), put back
    const int64_t R = rotary_dim(o_.rope, D);
    std::tie(q, k) = rotate(deinterleave(q, R), deinterleave(k, R), D, offset, cache);
    if (o_.rope_pairs_kept) std::tie(q, k) = std::make_pair(interleave(q, R), interleave(k, R));
  } else if (o_.rotary) {
    std::tie(q, k) = rotate(q, k, D, offset, cache);  // SmolLM3's NoPE layers have no positions at all
  }
  if (o_.qk_norm && o_.qk_norm_after_rope) {  // Hunyuan's: over each rotated head's values
    q = per_head(self_attn_->q_norm, q);
    k = per_head(self_attn_->k_norm, k);
  }
  if (o_.qk_l2_norm) {  // Llama 4's, after the rotation: no weight, in float32 for lower precisions
    auto l2 = [&](const at::Tensor& x) {
      const at::Tensor w = c10::isReducedFloatingType(x.scalar_type()) ? x.to(torch::kFloat) : x;
      return (w * torch::rsqrt(w.pow(2).mean(-1, /*keepdim=*/true) + o_.eps)).to(x.scalar_type());
    };
    q = l2(q);
    k = l2(k);
  }
  if (o_.q_temperature > 0) {  // Llama 4's NoPE layers, in transformers' operations: the scales in float32
    const at::Tensor positions = torch::arange(offset, offset + q.size(2), torch::TensorOptions(torch::kLong).device(q.device())).to(torch::kFloat);
    const at::Tensor scale = torch::log1p(torch::floor((positions + 1.0) / static_cast<double>(o_.q_temperature_floor))) * o_.q_temperature + 1.0;
    q = (q * scale.view({1, 1, -1, 1})).to(q.scalar_type());
  }
  if (o_.q_scale_beta > 0) {  // Ministral 3's, in transformers' operations (float32, then the queries' type)
    const at::Tensor positions = torch::arange(offset, offset + q.size(2), torch::TensorOptions(torch::kLong).device(q.device()));
    const at::Tensor scale = (torch::floor(positions / o_.q_scale_length) + 1).log() * o_.q_scale_beta + 1;
    q = q * scale.view({1, 1, -1, 1}).to(q.scalar_type());
  }
  const auto [keys, values] = extend(cache, k, v);
  const double scale = o_.attn_scale > 0 ? o_.attn_scale : 1.0 / std::sqrt(static_cast<double>(D));
  const at::Tensor out = causal_attention(q, keys, values, scale, o_.sliding_window, attn_drop_ ? attn_drop_.get() : nullptr, o_.attn_softcap,
                                          self_attn_->sinks, o_.attention_chunk, o_.kv_heads);
  drop_unseen(cache, o_.sliding_window, o_.attention_chunk);
  return gate.defined() ? out * torch::sigmoid(gate) : out;
}

// As transformers' DeepseekV3Attention computes it; the cache keeps the expanded keys and values.
at::Tensor LlamaBlockImpl::latent_attention(const at::Tensor& h, KvCache* cache) {
  const int64_t H = o_.n_heads, D = o_.head_dim, R = o_.rope_head_dim, N = D - R, V = o_.v_head_dim;
  const int64_t B = h.size(0), T = h.size(1);
  const MlaAttentionImpl& a = *mla_;
  const at::Tensor qs = a.q_proj ? run(a.q_proj, h) : run(a.q_b_proj, mla_->q_a_layernorm(run(a.q_a_proj, h)));
  const at::Tensor q = heads(qs, H, D);
  const auto kv = run(a.kv_a_proj_with_mqa, h).split_with_sizes({o_.kv_lora_rank, R}, -1);
  const at::Tensor latent = mla_->kv_a_layernorm(kv[0]);
  at::Tensor q_rot = q.narrow(-1, N, R), k_rot = kv[1].view({B, 1, T, R});
  if (o_.rope_interleave) {  // pairs (x0, x1), (x2, x3), ...: the even values, then the odd ones
    q_rot = deinterleave(q_rot);
    k_rot = deinterleave(k_rot);
  }
  const int64_t offset = cache ? cache->length() : 0;
  std::tie(q_rot, k_rot) = rotate(q_rot, k_rot, R, offset, cache);
  if (o_.rope_interleave && o_.rope_pairs_kept) {  // DeepSeek-V2's: the pairs back in their places
    q_rot = interleave(q_rot);
    k_rot = interleave(k_rot);
  }
  const at::Tensor kv_heads = run(a.kv_b_proj, latent).view({B, T, H, N + V}).transpose(1, 2);
  const at::Tensor k = torch::cat({kv_heads.narrow(-1, 0, N), k_rot.expand({B, H, T, R})}, -1);
  const at::Tensor v = kv_heads.narrow(-1, N, V);
  const auto [keys, values] = extend(cache, k, v);
  const double scale = o_.attn_scale > 0 ? o_.attn_scale : 1.0 / std::sqrt(static_cast<double>(D));
  return causal_attention(torch::cat({q.narrow(-1, 0, N), q_rot}, -1), keys, values, scale, o_.sliding_window, nullptr,
                          o_.attn_softcap, {}, o_.attention_chunk);
}

torch::Tensor LlamaBlockImpl::forward_cached(const torch::Tensor& x, KvCache* cache) {
  auto mlp = [&](const at::Tensor& in) { return moe_ ? moe_(in) : mlp_(in); };
  if (o_.no_mixer) {  // Nemotron-H's MLP and MoE blocks: each position alone (the cache counts them)
    if (cache) cache->positions += x.size(1);
    return x + mlp(post_attention_layernorm_(x));
  }
  const at::Tensor h = o_.norms == NormPlacement::Post ? x : input_layernorm_(x);
  const at::Tensor a = linear_attn_ ? linear_attn_->forward(h, cache)
                       : mamba_    ? mamba_->forward(h, cache)
                                   : project(o_.mla() ? mla_->o_proj : self_attn_->o_proj, merge_heads(attention(h, cache)), o_.bias_apart);
  if (o_.no_mlp) return x + a;  // Nemotron-H's mixer blocks
  // Granite's residual multiplier: a branch's output times it, a Python number's multiply.
  auto branch = [&](const at::Tensor& t) { return o_.residual_scale != 1.0 ? t * o_.residual_scale : t; };
  if (o_.norms == NormPlacement::Parallel || o_.norms == NormPlacement::ParallelTwo) {
    // Cohere's one norm for both branches, GPT-NeoX's two; summed as each sums (Phi's and GPT-NeoX's
    // branches first); dropped before the sum (Phi's resid_pdrop, GPT-NeoX's hidden_dropout).
    const at::Tensor m = mlp(o_.norms == NormPlacement::Parallel ? h : post_attention_layernorm_(x));
    const at::Tensor da = resid_drop_ ? resid_drop_(a) : branch(a), dm = resid_drop_ ? mlp_drop_(m) : branch(m);
    return o_.parallel_branches_first ? (da + dm) + x : x + da + dm;
  }
  if (o_.norms == NormPlacement::Pre && resid_drop_) {  // StarCoder2's, Seed-OSS's dropout before each residual add
    const at::Tensor h1 = x + resid_drop_(a);
    return h1 + mlp_drop_(mlp(post_attention_layernorm_(h1)));
  }
  if (o_.norms == NormPlacement::Pre) {
    const at::Tensor h1 = x + branch(a);
    return h1 + branch(mlp(post_attention_layernorm_(h1)));
  }
  const at::Tensor h1 = x + branch(post_attention_layernorm_(a));
  return h1 + branch(post_feedforward_layernorm_(mlp(o_.norms == NormPlacement::Sandwich ? pre_feedforward_layernorm_(h1) : h1)));
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
  const at::Tensor a = run(mlp_->c_fc, ln_2_(h));
  // gelu_new as transformers writes it, op by op (the fused tanh GELU rounds otherwise).
  const at::Tensor g = apply_gelu(o_.gelu_new ? Gelu::New : Gelu::Tanh, a);
  return h + mlp_drop_(run(mlp_->c_proj, g));
}

}  // namespace pipetrain::models
