// Mamba 2's mixer (models/decoder.h), Granite 4.0-H's: transformers' torch path (its
// torch_forward and mamba2_chunk_scan), its operations in its order, so that a float32 forward
// gives its bits.
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

// [B, T, ...] padded with zeros to [B, T + pad, ...].
at::Tensor pad_positions(const at::Tensor& x, int64_t pad) {
  std::vector<int64_t> p(2 * (x.dim() - 2), 0);
  p.push_back(0);
  p.push_back(pad);
  return torch::constant_pad_nd(x, p);
}

// [B, T, ...] padded and split into chunks: [B, chunks, chunk, ...].
at::Tensor into_chunks(const at::Tensor& x, int64_t pad, int64_t chunk) {
  const at::Tensor padded = pad_positions(x, pad);
  std::vector<int64_t> shape{padded.size(0), -1, chunk};
  for (int64_t d = 2; d < padded.dim(); ++d) shape.push_back(padded.size(d));
  return padded.reshape(shape);
}

// transformers' segment_sum: [..., L] to [..., L, L], the sums of x over (j, i] below and on the
// diagonal, -inf above.
at::Tensor segment_sum(const at::Tensor& x) {
  const int64_t L = x.size(-1);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.push_back(L);
  const auto opts = torch::TensorOptions(torch::kBool).device(x.device());
  const at::Tensor below = torch::ones({L, L}, opts).tril(-1), on_or_below = torch::ones({L, L}, opts).tril(0);
  const at::Tensor sums = x.unsqueeze(-1).expand(shape).masked_fill(below.logical_not(), 0).cumsum(-2);
  return sums.masked_fill(on_or_below.logical_not(), -INFINITY);
}

}  // namespace

at::Tensor mamba2_chunk_scan(const at::Tensor& x0, const at::Tensor& dt0, const at::Tensor& A0, const at::Tensor& Bm0, const at::Tensor& C0,
                             const at::Tensor& D, int64_t chunk, at::Tensor* state_io) {
  const int64_t B = x0.size(0), T = x0.size(1), H = x0.size(2), P = x0.size(3), G = Bm0.size(2);
  PIPETRAIN_CHECK(H % G == 0 && chunk > 0);
  const at::ScalarType type = compute_type(x0.scalar_type());
  at::Tensor x = x0.to(type);
  const at::Tensor Bm = Bm0.to(type).repeat_interleave(H / G, 2), C = C0.to(type).repeat_interleave(H / G, 2);
  const int64_t pad = (chunk - T % chunk) % chunk;
  const at::Tensor skip = D.unsqueeze(-1) * pad_positions(x, pad);
  const at::Tensor dt = dt0.to(type);
  x = x * dt.unsqueeze(-1);
  at::Tensor A = A0.to(type) * dt;
  x = into_chunks(x, pad, chunk);                                                     // b c l h p
  const at::Tensor Bc = into_chunks(Bm, pad, chunk), Cc = into_chunks(C, pad, chunk);  // b c l h n
  A = into_chunks(A, pad, chunk).permute({0, 3, 1, 2});                               // b h c l
  const at::Tensor A_cumsum = A.cumsum(-1);
  // Within each chunk (the diagonal blocks).
  const at::Tensor L = segment_sum(A).exp();
  const at::Tensor M = torch::einsum("bclhn,bcshn->bclsh", {Cc, Bc}) * L.permute({0, 2, 3, 4, 1});
  const at::Tensor Y_diag = torch::einsum("bclsh,bcshp->bclhp", {M, x});
  // Each chunk's state, then the states carried from chunk to chunk.
  const at::Tensor decay_states = (A_cumsum.index({Slice(), Slice(), Slice(), Slice(-1, torch::indexing::None)}) - A_cumsum).exp();
  const at::Tensor B_decay = Bc * decay_states.permute({0, 2, 3, 1}).unsqueeze(-1);
  at::Tensor states = torch::einsum("bclhn,bclhp->bchpn", {B_decay, x});
  const at::Tensor previous = state_io && state_io->defined() ? state_io->to(states.scalar_type()).unsqueeze(1)
                                                              : torch::zeros_like(states.narrow(1, 0, 1));
  states = torch::cat({previous, states}, 1);
  const at::Tensor last = torch::constant_pad_nd(A_cumsum.select(-1, A_cumsum.size(-1) - 1), {1, 0});
  const at::Tensor decay_chunk = segment_sum(last).exp().transpose(1, 3);
  const at::Tensor new_states = torch::einsum("bzch,bzhpn->bchpn", {decay_chunk, states});
  states = new_states.narrow(1, 0, new_states.size(1) - 1);
  if (state_io) *state_io = new_states.select(1, new_states.size(1) - 1);
  // Each position's reading of its chunk's first state (the off-diagonal blocks).
  const at::Tensor Y_off = torch::einsum("bclhn,bchpn->bclhp", {Cc, states}) * A_cumsum.exp().permute({0, 2, 3, 1}).unsqueeze(-1);
  const at::Tensor y = (Y_diag + Y_off).contiguous().reshape({B, -1, H, P}) + skip;
  return y.narrow(1, 0, T);
}

at::Tensor mamba2_recurrent_scan(const at::Tensor& x0, const at::Tensor& dt0, const at::Tensor& A0, const at::Tensor& Bm0, const at::Tensor& C0,
                                 const at::Tensor& D, at::Tensor* state_io) {
  const int64_t B = x0.size(0), T = x0.size(1), H = x0.size(2), P = x0.size(3), G = Bm0.size(2), N = Bm0.size(3);
  PIPETRAIN_CHECK(H % G == 0);
  const at::ScalarType type = compute_type(x0.scalar_type());
  const at::Tensor x = x0.to(type), dt = dt0.to(type), A = A0.to(type), Dw = D.to(type);
  const at::Tensor Bm = Bm0.to(type).repeat_interleave(H / G, 2), C = C0.to(type).repeat_interleave(H / G, 2);
  at::Tensor state = state_io && state_io->defined() ? state_io->to(type) : torch::zeros({B, H, P, N}, x.options());
  std::vector<at::Tensor> out;
  out.reserve(T);
  for (int64_t t = 0; t < T; ++t) {
    const at::Tensor step = dt.select(1, t).unsqueeze(-1).unsqueeze(-1);  // [B, H, 1, 1]
    const at::Tensor xt = x.select(1, t);                                 // [B, H, P]
    state = state * (step * A.view({1, H, 1, 1})).exp() + step * Bm.select(1, t).unsqueeze(2) * xt.unsqueeze(-1);  // transformers' order
    out.push_back(torch::matmul(state, C.select(1, t).unsqueeze(-1)).squeeze(-1) + xt * Dw.unsqueeze(-1));
  }
  if (state_io) *state_io = state;
  return torch::stack(out, 1);
}

void Mamba2MixerImpl::reset() {
  const int64_t d = o_.d_model, H = o_.mamba_heads, P = o_.mamba_head_dim, N = o_.mamba_state, G = o_.mamba_groups, K = o_.mamba_conv_kernel;
  PIPETRAIN_CHECK(H > 0 && P > 0 && N > 0 && G > 0 && H % G == 0 && K > 0 && o_.mamba_chunk > 0);
  const int64_t I = H * P, channels = I + 2 * G * N;
  in_proj = register_module("in_proj", torch::nn::Linear(torch::nn::LinearOptions(d, I + channels + H).bias(o_.mamba_proj_bias)));
  conv1d = register_module("conv1d", torch::nn::Conv1d(torch::nn::Conv1dOptions(channels, channels, K).groups(channels).bias(o_.mamba_conv_bias).padding(K - 1)));
  dt_bias = register_parameter("dt_bias", torch::ones({H}));
  A_log = register_parameter("A_log", torch::log(torch::arange(1, H + 1, torch::kFloat)));  // transformers' initial values
  D = register_parameter("D", torch::ones({H}));
  norm = register_module("norm", RmsNorm(std::vector<int64_t>{I}, o_.eps));
  out_proj = register_module("out_proj", torch::nn::Linear(torch::nn::LinearOptions(I, d).bias(o_.mamba_proj_bias)));
}

torch::Tensor Mamba2MixerImpl::forward(const torch::Tensor& h, KvCache* cache) {
  const int64_t Bsz = h.size(0), T = h.size(1), H = o_.mamba_heads, P = o_.mamba_head_dim, N = o_.mamba_state, G = o_.mamba_groups;
  const int64_t I = H * P, channels = I + 2 * G * N;
  const auto parts = run(in_proj, h).split_with_sizes({I, channels, H}, -1);
  const at::Tensor& gate = parts[0];
  const at::Tensor xbc = parts[1].transpose(1, 2).to(conv1d->weight.scalar_type());  // [B, channels, T]
  const at::Tensor bias = o_.mamba_conv_bias ? conv1d->bias : at::Tensor();
  const at::Tensor conv = torch::silu(causal_depthwise_conv(xbc, conv1d->weight, bias, cache)).to(h.scalar_type()).transpose(1, 2);
  const auto xs = conv.split_with_sizes({I, G * N, G * N}, -1);
  const at::Tensor dt = torch::softplus(parts[2] + dt_bias.to(parts[2].scalar_type())).clamp(o_.mamba_dt_min, o_.mamba_dt_max);
  const at::ScalarType wide = compute_type(h.scalar_type());
  const at::Tensor A = -A_log.to(wide).exp();
  const at::Tensor x = xs[0].reshape({Bsz, T, H, P}), Bm = xs[1].reshape({Bsz, T, G, N}), C = xs[2].reshape({Bsz, T, G, N});
  at::Tensor* state = cache ? &cache->state : nullptr;
  if (cache) cache->positions += T;
  const at::Tensor y = (state && state->defined() && T == 1 ? mamba2_recurrent_scan(x, dt, A, Bm, C, D, state)
                                                            : mamba2_chunk_scan(x, dt, A, Bm, C, D, o_.mamba_chunk, state))
                           .reshape({Bsz, T, I});
  // The gated norm: y·silu(z) in float32 at least, RMS-normalized by groups, times the weight.
  const at::Tensor gated = (y.to(wide) * torch::silu(gate.to(wide))).view({Bsz, T, G, I / G});
  const at::Tensor normed = (gated * torch::rsqrt(gated.pow(2).mean(-1, /*keepdim=*/true) + o_.eps)).view({Bsz, T, I});
  return run(out_proj, (norm->weight * normed.to(y.scalar_type())).to(h.scalar_type()));
}

}  // namespace pipetrain::models
