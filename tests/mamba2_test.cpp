// Granite 4.0-H's piece of a llama_block (models/decoder.h): Mamba 2's scan by chunks against the
// recurrence written position by position here (several chunks, a short last one, grouped B and
// C; the gradients too; the state carried from call to call), the mixer's parameters counted
// before they are made, its causality, generation from its kept state, and its arguments checked;
// Nemotron-H's blocks of one part and its experts without a gate.
// Against transformers: HfParity.GraniteMoeHybrid*, HfParity.NemotronH*.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "models/decoder.h"
#include "models/generate.h"
#include "models/incremental.h"
#include "models/model.h"
#include "tests/layer_list_helpers.h"

using namespace pipetrain;
using nlohmann::json;

namespace {

// Each head's state S [P, N] takes S·exp(dt·A) + dt·x·Bᵀ at each position; the output is S·C + D·x.
at::Tensor recurrence(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A, const at::Tensor& B0, const at::Tensor& C0,
                      const at::Tensor& D) {
  const int64_t r = x.size(2) / B0.size(2);
  const at::Tensor B = B0.repeat_interleave(r, 2), C = C0.repeat_interleave(r, 2);
  at::Tensor S = torch::zeros({x.size(0), x.size(2), x.size(3), B.size(3)}, x.options());
  std::vector<at::Tensor> out;
  for (int64_t t = 0; t < x.size(1); ++t) {
    const at::Tensor d = dt.select(1, t).unsqueeze(-1).unsqueeze(-1);  // [b, H, 1, 1]
    S = S * (d * A.view({1, -1, 1, 1})).exp() + d * x.select(1, t).unsqueeze(-1) * B.select(1, t).unsqueeze(2);
    out.push_back((S * C.select(1, t).unsqueeze(2)).sum(-1) + x.select(1, t) * D.unsqueeze(-1));
  }
  return torch::stack(out, 1);
}

json mamba(const json& extra = json::object()) {
  json j{{"mamba_heads", 4}, {"mamba_head_dim", 3}, {"mamba_state", 5}, {"mamba_groups", 2}, {"mamba_conv_kernel", 3}, {"mamba_chunk", 4}};
  j.update(extra);
  return j;
}

}  // namespace

TEST(LayerList, Mamba2ScanByChunksIsTheRecurrence) {
  torch::manual_seed(7);
  const auto opts = torch::TensorOptions(torch::kDouble);
  // 150 positions: chunks of 64, 64 and a padded 22; two heads for each group's B and C.
  const at::Tensor x = torch::randn({2, 150, 4, 3}, opts).requires_grad_(), B = torch::randn({2, 150, 2, 5}, opts).requires_grad_();
  const at::Tensor C = torch::randn({2, 150, 2, 5}, opts).requires_grad_(), D = torch::randn({4}, opts).requires_grad_();
  const at::Tensor dt = (torch::rand({2, 150, 4}, opts) * 0.2 + 0.01).requires_grad_(), A = (-torch::rand({4}, opts) * 4 - 0.5).requires_grad_();
  const at::Tensor chunked = models::mamba2_chunk_scan(x, dt, A, B, C, D, 64), want = recurrence(x, dt, A, B, C, D);
  EXPECT_EQ(chunked.sizes(), (std::vector<int64_t>{2, 150, 4, 3}));
  EXPECT_LE((chunked - want).abs().max().item<double>(), 1e-12);
  EXPECT_GT(want.abs().max().item<double>(), 0.5);
  const at::Tensor w = torch::randn(want.sizes(), opts);
  const auto grads = torch::autograd::grad({(chunked * w).sum()}, {x, dt, A, B, C, D});
  const auto wanted = torch::autograd::grad({(want * w).sum()}, {x, dt, A, B, C, D});
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_LE((grads[i] - wanted[i]).abs().max().item<double>(), 1e-10) << i;
  // Chunks of 7 over 10 positions; float32 in, float32 out.
  const at::Tensor small = models::mamba2_chunk_scan(x.narrow(1, 0, 10), dt.narrow(1, 0, 10), A, B.narrow(1, 0, 10), C.narrow(1, 0, 10), D, 7);
  EXPECT_LE((small - want.narrow(1, 0, 10)).abs().max().item<double>(), 1e-12);
  const at::Tensor f = models::mamba2_chunk_scan(x.to(torch::kFloat), dt.to(torch::kFloat), A.to(torch::kFloat), B.to(torch::kFloat),
                                                 C.to(torch::kFloat), D.to(torch::kFloat), 64);
  EXPECT_EQ(f.scalar_type(), at::kFloat);
  EXPECT_LE((f.to(torch::kDouble) - want).abs().max().item<double>(), 1e-4);
  // Position by position, and the state carried from one call to the next.
  EXPECT_LE((models::mamba2_recurrent_scan(x, dt, A, B, C, D) - want).abs().max().item<double>(), 1e-12);
  at::Tensor state;
  auto part = [&](int64_t from, int64_t n, bool steps) {
    const at::Tensor xs = x.narrow(1, from, n), ds = dt.narrow(1, from, n), bs = B.narrow(1, from, n), cs = C.narrow(1, from, n);
    return steps ? models::mamba2_recurrent_scan(xs, ds, A, bs, cs, D, &state) : models::mamba2_chunk_scan(xs, ds, A, bs, cs, D, 64, &state);
  };
  const at::Tensor first = part(0, 70, false), step = part(70, 1, true), rest = part(71, 79, false);
  EXPECT_LE((torch::cat({first, step, rest}, 1) - want).abs().max().item<double>(), 1e-12);
  EXPECT_EQ(state.sizes(), (std::vector<int64_t>{2, 4, 3, 5}));
}

// The layer: its parameters (as transformers names them) counted before they are made; causal;
// a token mixer; generation's steps through its kept convolution inputs and state equal the
// whole window.
TEST(LayerList, Mamba2LayerIsCausalCountedAndChecked) {
  for (const json& extra : {json::object(), json{{"mamba_proj_bias", true}, {"mamba_conv_bias", false}, {"mamba_dt_max", 0.5}}}) {
    const json cfg = test::llama_list(mamba(extra));
    models::Model m = test::build_model_section(cfg);
    auto params = m.layers->named_parameters();
    EXPECT_EQ(params["b.llama.mamba.in_proj.weight"].sizes(), (std::vector<int64_t>{12 + (12 + 20) + 4, 16}));
    EXPECT_EQ(params["b.llama.mamba.conv1d.weight"].sizes(), (std::vector<int64_t>{32, 1, 3}));
    EXPECT_EQ(params.contains("b.llama.mamba.conv1d.bias"), !extra.contains("mamba_conv_bias"));
    EXPECT_EQ(params.contains("b.llama.mamba.out_proj.bias"), extra.contains("mamba_proj_bias"));
    EXPECT_EQ(params["b.llama.mamba.norm.weight"].sizes(), (std::vector<int64_t>{12}));
    EXPECT_EQ(params["b.llama.mamba.D"].sizes(), (std::vector<int64_t>{4}));
    EXPECT_FALSE(params.contains("b.llama.self_attn.q_proj.weight"));
    JsonReader r(cfg["layers"][1], "model.layers[1]", "test");
    EXPECT_EQ(models::parameter_values(models::read_llama_block(r)), double(test::block_values(m)));
    m.layers->eval();
    const at::Tensor ids = torch::randint(0, 20, {2, 6});
    test::expect_causal_mixer(m, ids, 3);  // past the kernel: through the state
    EXPECT_LE(test::incremental_gap(m, ids, {{0, 1}, {1, 3}, {4, 1}, {5, 1}}), 1e-12);
  }
  auto refused = [](const json& extra, const std::string& what) {
    const std::string e = test::build_error(test::llama_list(extra));
    EXPECT_NE(e.find(what), std::string::npos) << e;
  };
  refused(mamba({{"mamba_groups", 3}}), "mamba_groups: must divide mamba_heads (4)");
  refused({{"mamba_state", 4}}, "mamba_state: needs mamba_heads above 0 (Mamba 2's mixer)");
  refused(mamba({{"sliding_window", 4}}), "sliding_window: does not apply to Mamba 2's mixer");
  refused(mamba({{"linear_key_heads", 2}, {"linear_key_head_dim", 2}, {"linear_value_head_dim", 2}}), "mamba_heads: cannot be set with");
  refused(mamba({{"mamba_dt_min", 0.5}, {"mamba_dt_max", 0.1}}), "mamba_dt_max: must be at least mamba_dt_min (0.5)");
  json no_state = mamba();
  no_state.erase("mamba_state");
  refused(no_state, "mamba_state");
}

// Nemotron-H's blocks of one part: an MLP alone (position by position, its norm
// post_attention_layernorm's) or a mixer alone (input_layernorm's), their parameters counted;
// experts without a gate (relu²), their outputs summed in float32 in bfloat16; the refusals.
TEST(LayerList, BlocksOfOnePartAndExpertsWithoutAGate) {
  for (const json& extra : {json{{"mixer", false}, {"act", "relu2"}, {"mlp_gate", false}}, json{{"mlp", false}},
                            json{{"mlp", false}, {"mamba_heads", 2}, {"mamba_head_dim", 4}, {"mamba_state", 3}}}) {
    const json cfg = test::llama_list(extra);
    models::Model m = test::build_model_section(cfg);
    auto params = m.layers->named_parameters();
    const bool mlp_only = extra.contains("mixer");
    EXPECT_EQ(params.contains("b.llama.input_layernorm.weight"), !mlp_only) << extra;
    EXPECT_EQ(params.contains("b.llama.post_attention_layernorm.weight"), mlp_only) << extra;
    EXPECT_EQ(params.contains("b.llama.mlp.up_proj.weight"), mlp_only) << extra;
    EXPECT_FALSE(params.contains("b.llama.mlp.gate_proj.weight"));
    JsonReader r(cfg["layers"][1], "model.layers[1]", "test");
    EXPECT_EQ(models::parameter_values(models::read_llama_block(r)), double(test::block_values(m))) << extra;
    m.layers->eval();
    torch::NoGradGuard no_grad;
    const at::Tensor ids = torch::randint(0, 20, {2, 6});
    at::Tensor earlier = ids.clone();
    earlier.index_put_({torch::indexing::Slice(), 0}, (ids.select(1, 0) + 1) % 20);
    const double moved = (m.layers->forward(ids).narrow(1, 1, 5) - m.layers->forward(earlier).narrow(1, 1, 5)).abs().max().item<double>();
    if (mlp_only) EXPECT_EQ(moved, 0.0) << "an MLP alone mixes no positions";
    else EXPECT_GT(moved, 0.0) << extra;
  }
  // Experts without a gate and a shared one, summed in float32 in bfloat16.
  const json experts{{"experts", 4}, {"experts_per_token", 2}, {"mlp_gate", false}, {"act", "relu2"}, {"shared_expert", 6},
                     {"shared_expert_gate", false}, {"experts_sum_float32", true}, {"mixer", false}};
  const json cfg = test::llama_list(experts);
  models::Model m = test::build_model_section(cfg);
  auto params = m.layers->named_parameters();
  EXPECT_FALSE(params.contains("b.llama.mlp.experts.0.gate_proj.weight"));
  EXPECT_EQ(params["b.llama.mlp.shared_expert.up_proj.weight"].sizes(), (std::vector<int64_t>{6, 16}));
  JsonReader r(cfg["layers"][1], "model.layers[1]", "test");
  EXPECT_EQ(models::parameter_values(models::read_llama_block(r)), double(test::block_values(m)));
  // On a latent of 8: the experts' inputs and outputs of 8, into and out of it, counted.
  json on_latent = experts;
  on_latent["experts_latent"] = 8;
  models::Model lm = test::build_model_section(test::llama_list(on_latent));
  auto lp = lm.layers->named_parameters();
  EXPECT_EQ(lp["b.llama.mlp.experts.1.up_proj.weight"].sizes(), (std::vector<int64_t>{24, 8}));
  EXPECT_EQ(lp["b.llama.mlp.fc1_latent_proj.weight"].sizes(), (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(lp["b.llama.mlp.fc2_latent_proj.weight"].sizes(), (std::vector<int64_t>{16, 8}));
  JsonReader rl(test::llama_list(on_latent)["layers"][1], "model.layers[1]", "test");
  EXPECT_EQ(models::parameter_values(models::read_llama_block(rl)), double(test::block_values(lm)));
  torch::NoGradGuard no_grad;
  const at::Tensor ids = torch::randint(0, 20, {2, 6});
  const at::Tensor wide = m.layers->forward(ids);
  m.layers->to(torch::kBFloat16);
  EXPECT_LE((m.layers->forward(ids).to(torch::kFloat) - wide).abs().max().item<double>(), 0.1);
  auto refused = [](const json& extra, const std::string& what) {
    const std::string e = test::build_error(test::llama_list(extra));
    EXPECT_NE(e.find(what), std::string::npos) << e;
  };
  refused({{"mixer", false}, {"mlp", false}}, "mlp: false needs a mixer");
  refused({{"mixer", false}, {"norms", "post"}}, "mixer: false needs norms \"pre\"");
  refused(mamba({{"mixer", false}}), "mixer: false cannot be set with mamba_heads");
  refused({{"mlp", false}, {"experts", 4}}, "mlp: false cannot be set with experts");
  json grouped = experts;
  grouped.erase("experts_sum_float32");
  grouped["experts_kernel"] = "grouped";
  refused(grouped, "experts_kernel: \"grouped\" needs gated experts");
  refused({{"experts", 4}, {"experts_sum_float32", true}, {"experts_kernel", "grouped"}}, "experts_sum_float32: needs experts_kernel \"loop\"");
  refused({{"experts", 4}, {"experts_latent", 8}, {"experts_kernel", "grouped"}}, "experts_latent: needs experts_kernel \"loop\"");
  refused({{"experts_latent", 8}}, "experts_latent: needs experts above 0");
}
