// Qwen3-Next's and Qwen3.5's gated DeltaNet (models/decoder.h), in transformers' operations and
// order, so that a float32 forward gives its bits.
#include <cmath>
#include <vector>

#include <torch/torch.h>

#include "common/error.h"
#include "models/decoder.h"

namespace pipetrain::models {

namespace {

using torch::indexing::Slice;

at::Tensor run(const torch::nn::Linear& l, const at::Tensor& x) { return linear(x, l->weight, l->bias); }

// float32 for float32 and lower precisions, float64 for float64.
at::ScalarType compute_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// [B, T, H, D] as [B, H, T, D], contiguous, in `type`.
at::Tensor by_head(const at::Tensor& x, at::ScalarType type) { return x.transpose(1, 2).to(type).contiguous(); }

at::Tensor l2norm(const at::Tensor& x) { return x * torch::rsqrt((x * x).sum(-1, /*keepdim=*/true) + 1e-6); }

// The rule's inputs as both forms take them: each key head repeated for its value heads, every
// tensor [B, H, T, ...] in the computation's type, queries and keys L2-normalized.
struct RuleInputs {
  at::Tensor q, k, v, beta, decay;
  at::ScalarType out_type;
};

RuleInputs rule_inputs(at::Tensor q, at::Tensor k, const at::Tensor& v, const at::Tensor& g, const at::Tensor& beta) {
  const at::ScalarType out_type = q.scalar_type(), type = compute_type(out_type);
  const int64_t Hk = k.size(2), Hv = v.size(2);
  PIPETRAIN_CHECK(Hv % Hk == 0);
  if (Hk != Hv) {
    q = q.repeat_interleave(Hv / Hk, 2);
    k = k.repeat_interleave(Hv / Hk, 2);
  }
  return {l2norm(by_head(q, type)), l2norm(by_head(k, type)), by_head(v, type), beta.transpose(1, 2).to(type).contiguous(),
          g.transpose(1, 2).to(type).contiguous(), out_type};
}

}  // namespace

at::Tensor chunk_gated_delta_rule(at::Tensor q0, at::Tensor k0, at::Tensor v0, at::Tensor g, at::Tensor beta0, int64_t chunk,
                                  at::Tensor* state_io) {
  RuleInputs in = rule_inputs(q0, k0, v0, g, beta0);
  const int64_t B = in.v.size(0), Hv = in.v.size(1), T = in.v.size(2), Dk = in.k.size(3), Dv = in.v.size(3);
  at::Tensor q = in.q * std::pow(static_cast<double>(Dk), -0.5), k = in.k, v = in.v, beta = in.beta, decay = in.decay;
  const int64_t pad = (chunk - T % chunk) % chunk, L = T + pad, n = L / chunk;
  q = torch::constant_pad_nd(q, {0, 0, 0, pad});
  k = torch::constant_pad_nd(k, {0, 0, 0, pad});
  v = torch::constant_pad_nd(v, {0, 0, 0, pad});
  beta = torch::constant_pad_nd(beta, {0, pad});
  decay = torch::constant_pad_nd(decay, {0, pad});
  const at::Tensor v_beta = v * beta.unsqueeze(-1), k_beta0 = k * beta.unsqueeze(-1);
  auto chunked = [&](const at::Tensor& x) { return x.reshape({x.size(0), x.size(1), -1, chunk, x.size(-1)}); };
  q = chunked(q);
  k = chunked(k);
  const at::Tensor k_beta = chunked(k_beta0), vb = chunked(v_beta);
  decay = decay.reshape({decay.size(0), decay.size(1), -1, chunk});
  const at::Tensor upper = torch::ones({chunk, chunk}, torch::TensorOptions(torch::kBool).device(q.device())).triu(1);
  const at::Tensor cum = decay.cumsum(3);
  const at::Tensor pairwise = (cum.unsqueeze(4) - cum.unsqueeze(3)).masked_fill(upper, -INFINITY).exp();
  const at::Tensor ut = torch::matmul(k_beta, k.transpose(-1, -2)) * pairwise;
  const at::Tensor intra = torch::matmul(q, k.transpose(-1, -2)) * pairwise;
  const at::Tensor decayed_k_beta = k_beta * cum.exp().unsqueeze(-1);
  const at::Tensor values = torch::linalg_solve_triangular(ut, vb, /*upper=*/false, /*left=*/true, /*unitriangular=*/true);
  const at::Tensor k_cumdecay = torch::linalg_solve_triangular(ut, decayed_k_beta, false, true, true);
  at::Tensor state = state_io && state_io->defined() ? state_io->to(values.scalar_type()) : torch::zeros({B, Hv, Dk, Dv}, values.options());
  const at::Tensor qd = q * cum.exp().unsqueeze(-1);
  const at::Tensor kd = k * (cum.index({"...", Slice(-1, torch::indexing::None)}) - cum).exp().unsqueeze(-1);
  const at::Tensor chunk_decay = cum.select(-1, chunk - 1).exp().unsqueeze(-1).unsqueeze(-1);
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor v_new = values.select(2, i) - torch::matmul(k_cumdecay.select(2, i), state);
    const at::Tensor inter = torch::matmul(qd.select(2, i), state);
    out.push_back(inter + torch::matmul(intra.select(2, i), v_new));
    state = state * chunk_decay.select(2, i) + torch::matmul(kd.select(2, i).transpose(-1, -2), v_new);
  }
  if (state_io) *state_io = state;
  const at::Tensor o = torch::stack(out, 2).reshape({B, Hv, -1, Dv}).narrow(2, 0, T);
  return o.transpose(1, 2).to(in.out_type).contiguous();
}

at::Tensor recurrent_gated_delta_rule(at::Tensor q0, at::Tensor k0, at::Tensor v0, at::Tensor g, at::Tensor beta0, at::Tensor* state_io) {
  RuleInputs in = rule_inputs(q0, k0, v0, g, beta0);
  const int64_t B = in.v.size(0), Hv = in.v.size(1), T = in.v.size(2), Dk = in.k.size(3), Dv = in.v.size(3);
  const at::Tensor q = in.q / std::sqrt(static_cast<double>(Dk));
  at::Tensor state = state_io && state_io->defined() ? state_io->to(in.v.scalar_type()) : torch::zeros({B, Hv, Dk, Dv}, in.v.options());
  std::vector<at::Tensor> out;
  out.reserve(T);
  for (int64_t t = 0; t < T; ++t) {
    const at::Tensor kt = in.k.select(2, t).unsqueeze(-1);
    state = state * in.decay.select(2, t).exp().unsqueeze(-1).unsqueeze(-1);
    const at::Tensor read = (state * kt).sum(-2);
    const at::Tensor delta = (in.v.select(2, t) - read) * in.beta.select(2, t).unsqueeze(-1);
    state = state + kt * delta.unsqueeze(-2);
    out.push_back((state * q.select(2, t).unsqueeze(-1)).sum(-2));
  }
  if (state_io) *state_io = state;
  return torch::stack(out, 2).transpose(1, 2).contiguous().to(in.out_type);
}

at::Tensor causal_depthwise_conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, KvCache* cache) {
  const int64_t T = x.size(2), channels = x.size(1), K = weight.size(-1);
  if (cache && cache->conv.defined()) {  // after kept inputs: the convolution over them and these
    const at::Tensor full = torch::cat({cache->conv.to(x.scalar_type()), x}, -1);
    cache->conv = full.narrow(-1, full.size(-1) - (K - 1), K - 1);
    return torch::conv1d(full, weight, bias, at::IntArrayRef(1), at::IntArrayRef(0), at::IntArrayRef(1), channels);  // GCC: no string padding
  }
  if (cache) cache->conv = torch::constant_pad_nd(x, {std::max<int64_t>(K - 1 - T, 0), 0}).narrow(-1, std::max<int64_t>(T - (K - 1), 0), K - 1);
  return torch::conv1d(x, weight, bias, 1, K - 1, 1, channels).narrow(2, 0, T);
}

void GatedDeltaNetImpl::reset() {
  const int64_t d = o_.d_model, Hk = o_.linear_key_heads, Hv = o_.linear_value_heads;
  const int64_t Dk = o_.linear_key_head_dim, Dv = o_.linear_value_head_dim, K = o_.linear_conv_kernel;
  PIPETRAIN_CHECK(Hk > 0 && Hv % Hk == 0 && Dk > 0 && Dv > 0 && K > 0);
  const int64_t channels = 2 * Hk * Dk + Hv * Dv;
  auto lin = [&](const char* name, int64_t in, int64_t out) {
    return register_module(name, torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)));
  };
  if (o_.linear_split) {
    in_proj_qkv = lin("in_proj_qkv", d, channels);
    in_proj_z = lin("in_proj_z", d, Hv * Dv);
    in_proj_b = lin("in_proj_b", d, Hv);
    in_proj_a = lin("in_proj_a", d, Hv);
  } else {
    in_proj_qkvz = lin("in_proj_qkvz", d, 2 * Hk * Dk + 2 * Hv * Dv);
    in_proj_ba = lin("in_proj_ba", d, 2 * Hv);
  }
  conv1d = register_module("conv1d", torch::nn::Conv1d(torch::nn::Conv1dOptions(channels, channels, K).groups(channels).bias(false).padding(K - 1)));
  dt_bias = register_parameter("dt_bias", torch::ones({Hv}));
  A_log = register_parameter("A_log", torch::log(torch::empty({Hv}).uniform_(0.01, 16)));
  norm = register_module("norm", RmsNorm(std::vector<int64_t>{Dv}, o_.eps, RmsScale::AfterCast));
  out_proj = lin("out_proj", Hv * Dv, d);
}

torch::Tensor GatedDeltaNetImpl::forward(const torch::Tensor& h, KvCache* cache) {
  const int64_t B = h.size(0), T = h.size(1), Hk = o_.linear_key_heads, Hv = o_.linear_value_heads;
  const int64_t Dk = o_.linear_key_head_dim, Dv = o_.linear_value_head_dim, r = Hv / Hk;
  at::Tensor mixed, z, b, a;  // [B, channels, T]; [B, T, Hv, Dv]; [B, T, Hv] each
  if (o_.linear_split) {  // Qwen3.5's: every query, then every key, then every value
    mixed = run(in_proj_qkv, h).transpose(1, 2);
    z = run(in_proj_z, h).reshape({B, T, Hv, Dv});
    b = run(in_proj_b, h);
    a = run(in_proj_a, h);
  } else {  // Qwen3-Next's: each key head's group, its query, its key, its r value heads' values and output gates
    const auto qkvz = run(in_proj_qkvz, h).view({B, T, Hk, 2 * Dk + 2 * r * Dv}).split_with_sizes({Dk, Dk, r * Dv, r * Dv}, 3);
    const auto ba = run(in_proj_ba, h).view({B, T, Hk, 2 * r}).split_with_sizes({r, r}, 3);
    z = qkvz[3].reshape({B, T, Hv, Dv});
    b = ba[0].reshape({B, T, Hv});
    a = ba[1].reshape({B, T, Hv});
    mixed = torch::cat({qkvz[0].reshape({B, T, -1}), qkvz[1].reshape({B, T, -1}), qkvz[2].reshape({B, T, -1})}, -1).transpose(1, 2);
  }
  const at::Tensor conv = torch::silu(causal_depthwise_conv(mixed, conv1d->weight, {}, cache)).transpose(1, 2);
  const auto qkv = conv.split_with_sizes({Hk * Dk, Hk * Dk, Hv * Dv}, -1);
  const at::Tensor q = qkv[0].reshape({B, T, Hk, Dk}), k = qkv[1].reshape({B, T, Hk, Dk}), v = qkv[2].reshape({B, T, Hv, Dv});
  const at::ScalarType wide = compute_type(h.scalar_type());
  const at::Tensor beta = b.sigmoid();
  const at::Tensor g = -A_log.to(wide).exp() * torch::softplus(a.to(wide) + dt_bias);
  // Generation's steps (a cached state, one position) position by position, as transformers'; chunks otherwise.
  at::Tensor* state = cache ? &cache->state : nullptr;
  if (cache) cache->positions += T;
  const at::Tensor core = (state && state->defined() && T == 1 ? recurrent_gated_delta_rule(q, k, v, g, beta, state)
                                                               : chunk_gated_delta_rule(q, k, v, g, beta, 64, state))
                              .reshape({-1, Dv});
  // The norm (Llama's RMSNorm), times silu(z) in float32 at least, back in the model's type.
  const at::Tensor gated = (norm(core) * torch::silu(z.reshape({-1, Dv}).to(wide))).to(h.scalar_type());
  return run(out_proj, gated.reshape({B, T, Hv * Dv}));
}

}  // namespace pipetrain::models
