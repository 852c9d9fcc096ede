// A mixture of experts' products as grouped GEMMs (LlamaBlockOptions::grouped_experts): the
// choices sorted by expert, each expert's rows one group of at::_grouped_mm over the experts'
// weights stacked, the group ends computed on the device. Nothing is read on the host, so a CUDA
// graph can replay it (the expert-by-expert loop reads each expert's row count every forward).
#include <string>
#include <vector>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "common/error.h"
#include "common/replayable.h"
#include "models/decoder.h"

namespace pipetrain::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The experts' weights [E, out, in], `parts` lists of E weights each side by side along out
// (gate's then up's: one product for both, as transformers' gate_up_proj).
at::Tensor stacked(at::TensorList weights, int64_t parts) {
  const int64_t E = static_cast<int64_t>(weights.size()) / parts;
  if (parts == 1) return torch::stack(weights);
  std::vector<at::Tensor> each;
  for (int64_t p = 0; p < parts; ++p) each.push_back(torch::stack(weights.slice(p * E, E)));
  return torch::cat(each, 1);
}

// y [S, out] of x [S, in]: group e's rows (offsets: each group's end, int32) times W_e^T. The
// stack W is made in the forward and again in the backward, never kept between them: autograd
// would otherwise hold a copy of every expert's weights per layer and micro-batch.
struct GroupedLinear : torch::autograd::Function<GroupedLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& offsets, int64_t parts,
                            at::TensorList weights) {
    std::vector<at::Tensor> saved{x, offsets};
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["parts"] = parts;
    return at::_grouped_mm(x, stacked(weights, parts).to(x.scalar_type()).transpose(1, 2), offsets);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &offsets = saved[1];
    const int64_t parts = ctx->saved_data["parts"].toInt();
    const at::TensorList weights = at::TensorList(saved).slice(2);
    const int64_t E = static_cast<int64_t>(weights.size()) / parts;
    const at::Tensor gy = grads[0].contiguous();
    variable_list out(3 + weights.size());
    if (ctx->needs_input_grad(0)) out[0] = at::_grouped_mm(gy, stacked(weights, parts).to(gy.scalar_type()), offsets);
    bool weighted = false;  // any expert's weight trained
    for (size_t i = 0; i < weights.size(); ++i) weighted = weighted || ctx->needs_input_grad(3 + i);
    if (!weighted) return out;
    // Each expert's gradient: its rows of gy^T times its rows of x, one group each (none: zeros).
    const at::Tensor gw = at::_grouped_mm(gy.t(), x, offsets);  // [E, out, in]
    for (int64_t p = 0, row = 0; p < parts; row += weights[p * E].size(0), ++p)
      for (int64_t e = 0; e < E; ++e)
        out[3 + p * E + e] = gw.select(0, e).narrow(0, row, weights[p * E].size(0)).to(weights[p * E + e].scalar_type());
    return out;
  }
};

// In `type` (the autocast type where autocast is on: torch's grouped GEMM is not autocast's).
at::Tensor grouped_linear(const at::Tensor& x, const at::Tensor& offsets, int64_t parts, const std::vector<at::Tensor>& w,
                          at::ScalarType type) {
  return GroupedLinear::apply(x.to(type).contiguous(), offsets, parts, at::TensorList(w));
}

// The type the products run in: autocast's where it is on for h's device, h's otherwise.
at::ScalarType compute_type(const at::Tensor& h) {
  const c10::DeviceType device = h.device().type();
  return at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device) : h.scalar_type();
}

}  // namespace

std::string MoeImpl::why_not_grouped(const at::Tensor& h) const {
  const at::ScalarType t = compute_type(h);
  if (t != at::kFloat && t != at::kBFloat16 && t != at::kHalf)
    return detail::concat("grouped experts: torch's grouped GEMM takes no ", t,
                          "; the experts run one after another, reading their routing on the host");
  const int64_t bytes = static_cast<int64_t>(c10::elementSize(t));
  if (o_.d_model * bytes % 16 || o_.d_ff * bytes % 16)
    return detail::concat("grouped experts: torch's grouped GEMM needs rows of a multiple of 16 bytes (d_model ", o_.d_model,
                          " and d_ff ", o_.d_ff, " of ", t, "); the experts run one after another, reading their routing on the host");
  return "";
}

at::Tensor MoeImpl::grouped(const at::Tensor& h, const at::Tensor& top, const at::Tensor& chosen) {
  const at::ScalarType type = compute_type(h);
  if (h.is_cuda() && type != at::kBFloat16)
    note_not_replayable("grouped experts: torch's grouped GEMM reads its groups on the host on a GPU except in bfloat16");
  const int64_t N = h.size(0), k = chosen.size(1), S = N * k, F = o_.d_ff;
  // The choices token by token (token * k + rank), sorted stably by expert; each expert's end.
  const at::Tensor ids = chosen.reshape({-1});
  const at::Tensor perm = std::get<1>(ids.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
  const at::Tensor offsets =
      torch::zeros({o_.experts}, ids.options()).scatter_add_(0, ids, torch::ones_like(ids)).cumsum(0).to(torch::kInt);
  const at::Tensor expert = ids.index_select(0, perm);
  at::Tensor in = h.index_select(0, perm.div(k, "floor"));
  const at::Tensor weight = top.reshape({-1}).index_select(0, perm).unsqueeze(1);
  if (o_.router_scales_input) in = in * weight;
  std::vector<at::Tensor> gate_up(2 * o_.experts), down(o_.experts), gate_b, up_b, down_b;
  for (int64_t e = 0; e < o_.experts; ++e) {
    const GatedMlpImpl& x = *experts[e]->as<GatedMlpImpl>();
    gate_up[e] = x.gate_proj->weight;
    gate_up[o_.experts + e] = x.up_proj->weight;
    down[e] = x.down_proj->weight;
    if (o_.mlp_bias) {
      gate_b.push_back(x.gate_proj->bias);
      up_b.push_back(x.up_proj->bias);
      down_b.push_back(x.down_proj->bias);
    }
  }
  const at::Tensor both = grouped_linear(in, offsets, 2, gate_up, type);
  at::Tensor gate = both.narrow(1, 0, F), up = both.narrow(1, F, F);
  if (o_.mlp_bias) {  // each row its expert's biases
    gate = gate + torch::stack(gate_b).index_select(0, expert);
    up = up + torch::stack(up_b).index_select(0, expert);
  }
  at::Tensor y = grouped_linear(experts[0]->as<GatedMlpImpl>()->activate(gate, up), offsets, 1, down, type);
  if (o_.mlp_bias) y = y + torch::stack(down_b).index_select(0, expert);
  if (!o_.router_scales_input) y = y * weight;
  // Back in token order, each token's choices summed (transformers' grouped_mm experts' sum).
  const at::Tensor back = torch::empty_like(perm).scatter_(0, perm, torch::arange(S, perm.options()));
  return y.index_select(0, back).view({N, k, -1}).sum(1).to(h.scalar_type());
}

}  // namespace pipetrain::models
