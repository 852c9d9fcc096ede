// Causal attention of the decoder blocks (models/decoder.h): fused where no mask is needed, a
// boolean mask for windows, chunks and queries after cached positions, the explicit path for
// dropout, soft caps and sinks.
#include <cmath>

#include <torch/torch.h>

#include "common/error.h"
#include "models/decoder.h"

namespace pipetrain::models {

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                            int64_t window, DropoutImpl* dropout, double softcap, const at::Tensor& sinks, int64_t chunk,
                            KvHeads kv_heads) {
  const int64_t H = q.size(1), KV = k.size(1), Tq = q.size(2), Tk = k.size(2), offset = Tk - Tq;
  PIPETRAIN_CHECK(offset >= 0 && KV > 0 && H % KV == 0);
  const bool gqa = H != KV, masked = (window > 0 && Tk > window) || (chunk > 0 && Tk > chunk);
  const bool dropping = dropout && dropout->is_training() && dropout->p() > 0;
  const bool explicit_path = dropping || softcap > 0 || sinks.defined();
  // Each key and value head repeated for its queries' heads as transformers repeats them
  // (repeat_kv: expanded, then reshaped).
  auto repeated = [&](const at::Tensor& x) {
    return gqa ? x.unsqueeze(2).expand({x.size(0), KV, H / KV, x.size(2), x.size(3)}).reshape({x.size(0), H, x.size(2), x.size(3)}) : x;
  };
  if (!explicit_path && !masked && (offset == 0 || Tq == 1)) {
    if (gqa && kv_heads == KvHeads::Repeated) return at::scaled_dot_product_attention(q, repeated(k), repeated(v), {}, 0.0, Tq > 1, scale);
    PIPETRAIN_CHECK(kv_heads != KvHeads::Broadcast || KV == 1);
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/Tq > 1, scale, gqa && kv_heads == KvHeads::Grouped);
  }
  // Query i is position offset + i; it sees keys j <= offset + i (and > offset + i - window).
  const auto longs = torch::TensorOptions(torch::kLong).device(q.device());
  const at::Tensor i = torch::arange(offset, Tk, longs).unsqueeze(1), j = torch::arange(Tk, longs).unsqueeze(0);
  at::Tensor allowed = j <= i;
  if (window > 0) allowed = allowed.logical_and(j > i - window);
  if (chunk > 0) allowed = allowed.logical_and(j.div(chunk, "floor") == i.div(chunk, "floor"));
  // With a mask, repeated, not sdpa's grouped-query path: the backward then sums each group's
  // gradients as transformers' does (its bfloat16 training bit for bit).
  const at::Tensor kk = repeated(k), vv = repeated(v);
  if (!explicit_path) return at::scaled_dot_product_attention(q, kk, vv, allowed, 0.0, false, scale);
  at::Tensor att = torch::matmul(q, kk.transpose(-2, -1)) * scale;
  if (softcap > 0) att = torch::tanh(att / softcap) * softcap;
  att = att.masked_fill(allowed.logical_not(), -INFINITY);
  if (sinks.defined()) {  // GPT-OSS's: the sink's logit in the denominator, the softmax in the scores' type
    const at::Tensor combined = torch::cat({att, sinks.to(att.scalar_type()).view({1, H, 1, 1}).expand({att.size(0), H, Tq, 1})}, -1);
    const at::Tensor probs = torch::softmax(combined - std::get<0>(combined.max(-1, /*keepdim=*/true)), -1);
    return torch::matmul(probs.narrow(-1, 0, Tk).to(vv.scalar_type()), vv);
  }
  // The softmax in float32 for lower precisions, as transformers' eager attention takes it.
  att = c10::isReducedFloatingType(att.scalar_type()) ? torch::softmax(att, -1, torch::kFloat).to(q.scalar_type()) : torch::softmax(att, -1);
  return torch::matmul(dropping ? dropout->forward(att) : att, vv);
}

}  // namespace pipetrain::models
