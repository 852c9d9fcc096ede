// Qwen3-Next's pieces of a llama_block (models/decoder.h): the gated delta rule by chunks against
// the rule written token by token (several chunks, a short last one, grouped value heads; the
// gradients too), the gated DeltaNet layer's parameters counted before they are made, the
// gated attention's gate, the arguments checked, and a block with the DeltaNet generating from
// its kept state. Against transformers: HfParity.Qwen3Next*.
#include <gtest/gtest.h>

#include <cmath>

#include <torch/torch.h>

#include "models/decoder.h"
#include "models/generate.h"
#include "models/incremental.h"
#include "models/model.h"
#include "tests/layer_list_helpers.h"

using namespace pipetrain;
using nlohmann::json;

namespace {

// The rule token by token (the recurrence the chunks compute), in q's type.
at::Tensor recurrent(const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v, const at::Tensor& g, const at::Tensor& beta) {
  const int64_t r = v.size(2) / k0.size(2);
  at::Tensor q = q0.repeat_interleave(r, 2), k = k0.repeat_interleave(r, 2);
  q = q * torch::rsqrt((q * q).sum(-1, true) + 1e-6) * std::pow(double(q.size(-1)), -0.5);
  k = k * torch::rsqrt((k * k).sum(-1, true) + 1e-6);
  at::Tensor state = torch::zeros({v.size(0), v.size(2), k.size(3), v.size(3)}, v.options());
  std::vector<at::Tensor> out;
  for (int64_t t = 0; t < v.size(1); ++t) {
    const at::Tensor kt = k.select(1, t).unsqueeze(-1);  // [B, H, Dk, 1]
    state = state * g.select(1, t).exp().unsqueeze(-1).unsqueeze(-1);
    const at::Tensor read = (state * kt).sum(-2);  // [B, H, Dv]
    state = state + kt * ((v.select(1, t) - read) * beta.select(1, t).unsqueeze(-1)).unsqueeze(-2);
    out.push_back((state * q.select(1, t).unsqueeze(-1)).sum(-2));
  }
  return torch::stack(out, 1);
}

json deltanet(const json& extra = json::object()) {
  json j{{"linear_key_heads", 2}, {"linear_value_heads", 4}, {"linear_key_head_dim", 4}, {"linear_value_head_dim", 3},
         {"linear_conv_kernel", 3}};
  j.update(extra);
  return j;
}

}  // namespace

TEST(LayerList, GatedDeltaRuleByChunksIsTheRecurrence) {
  torch::manual_seed(5);
  const auto opts = torch::TensorOptions(torch::kDouble);
  // 150 positions: chunks of 64, 64 and a padded 22; two value heads for each key head.
  const at::Tensor q = torch::randn({2, 150, 2, 4}, opts).requires_grad_(), k = torch::randn({2, 150, 2, 4}, opts).requires_grad_();
  const at::Tensor v = torch::randn({2, 150, 4, 3}, opts).requires_grad_();
  const at::Tensor g = (-torch::rand({2, 150, 4}, opts) * 0.3).requires_grad_(), beta = torch::rand({2, 150, 4}, opts).requires_grad_();
  const at::Tensor chunked = models::chunk_gated_delta_rule(q, k, v, g, beta), want = recurrent(q, k, v, g, beta);
  EXPECT_EQ(chunked.sizes(), (std::vector<int64_t>{2, 150, 4, 3}));
  EXPECT_LE((chunked - want).abs().max().item<double>(), 1e-12);
  EXPECT_GT(want.abs().max().item<double>(), 0.1);
  // Every input's gradient, of a weighted sum of the outputs.
  const at::Tensor w = torch::randn(want.sizes(), opts);
  const auto grads = torch::autograd::grad({(chunked * w).sum()}, {q, k, v, g, beta});
  const auto wanted = torch::autograd::grad({(want * w).sum()}, {q, k, v, g, beta});
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_LE((grads[i] - wanted[i]).abs().max().item<double>(), 1e-10) << i;
  // Chunks of 4 over 10 positions; float32 in, float32 out (computed in float32).
  const at::Tensor small = models::chunk_gated_delta_rule(q.narrow(1, 0, 10), k.narrow(1, 0, 10), v.narrow(1, 0, 10), g.narrow(1, 0, 10),
                                                          beta.narrow(1, 0, 10), 4);
  EXPECT_LE((small - want.narrow(1, 0, 10)).abs().max().item<double>(), 1e-12);
  const at::Tensor f = models::chunk_gated_delta_rule(q.to(torch::kFloat), k.to(torch::kFloat), v.to(torch::kFloat), g.to(torch::kFloat),
                                                      beta.to(torch::kFloat));
  EXPECT_EQ(f.scalar_type(), at::kFloat);
  EXPECT_LE((f.to(torch::kDouble) - want).abs().max().item<double>(), 1e-4);
  // Position by position (generation's steps), and the state carried from one call to the next.
  EXPECT_LE((models::recurrent_gated_delta_rule(q, k, v, g, beta) - want).abs().max().item<double>(), 1e-12);
  at::Tensor state;
  const at::Tensor first = models::chunk_gated_delta_rule(q.narrow(1, 0, 70), k.narrow(1, 0, 70), v.narrow(1, 0, 70), g.narrow(1, 0, 70),
                                                          beta.narrow(1, 0, 70), 64, &state);
  const at::Tensor step = models::recurrent_gated_delta_rule(q.narrow(1, 70, 1), k.narrow(1, 70, 1), v.narrow(1, 70, 1), g.narrow(1, 70, 1),
                                                             beta.narrow(1, 70, 1), &state);
  const at::Tensor rest = models::chunk_gated_delta_rule(q.narrow(1, 71, 79), k.narrow(1, 71, 79), v.narrow(1, 71, 79), g.narrow(1, 71, 79),
                                                         beta.narrow(1, 71, 79), 64, &state);
  EXPECT_LE((torch::cat({first, step, rest}, 1) - want).abs().max().item<double>(), 1e-12);
  EXPECT_EQ(state.sizes(), (std::vector<int64_t>{2, 4, 4, 3}));
}

// The layer: its parameters (as transformers names them) counted before they are made; a
// position's output depends on the earlier positions (a token mixer) and not on the later ones
// (causal); generation's steps through its kept state equal the whole window.
TEST(LayerList, GatedDeltaNetLayerIsCausalCountedAndChecked) {
  const json cfg = test::llama_list(deltanet());
  models::Model m = test::build_model_section(cfg);
  auto params = m.layers->named_parameters();
  EXPECT_EQ(params["b.llama.linear_attn.in_proj_qkvz.weight"].sizes(), (std::vector<int64_t>{2 * 8 + 2 * 12, 16}));
  EXPECT_EQ(params["b.llama.linear_attn.in_proj_ba.weight"].sizes(), (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(params["b.llama.linear_attn.conv1d.weight"].sizes(), (std::vector<int64_t>{8 + 8 + 12, 1, 3}));
  EXPECT_EQ(params["b.llama.linear_attn.norm.weight"].sizes(), (std::vector<int64_t>{3}));
  EXPECT_FALSE(params.contains("b.llama.self_attn.q_proj.weight"));
  JsonReader r(cfg["layers"][1], "model.layers[1]", "test");
  EXPECT_EQ(models::parameter_values(models::read_llama_block(r)), double(test::block_values(m)));
  m.layers->eval();
  const at::Tensor ids = torch::randint(0, 20, {2, 6});
  test::expect_causal_mixer(m, ids, 1);
  // Generation's steps: the kept convolution inputs and state, position by position (the rule's
  // steps), give the whole window's outputs.
  EXPECT_LE(test::incremental_gap(m, ids, {{0, 2}, {2, 1}, {3, 1}, {4, 2}}), 1e-12);
  // The gated attention: q_proj twice as wide (a gate per head), counted.
  const json gated = test::llama_list({{"attn_output_gate", true}, {"qkv_bias", true}});
  models::Model ga = test::build_model_section(gated);
  EXPECT_EQ(ga.layers->named_parameters()["b.llama.self_attn.q_proj.weight"].sizes(), (std::vector<int64_t>{32, 16}));
  JsonReader rg(gated["layers"][1], "model.layers[1]", "test");
  EXPECT_EQ(models::parameter_values(models::read_llama_block(rg)), double(test::block_values(ga)));
  // Refused, each by name.
  auto refused = [](const json& extra, const std::string& what) {
    const std::string e = test::build_error(test::llama_list(extra));
    EXPECT_NE(e.find(what), std::string::npos) << e;
  };
  refused(deltanet({{"linear_value_heads", 3}}), "linear_value_heads: must be a multiple of linear_key_heads (2)");
  refused({{"linear_key_head_dim", 4}}, "linear_key_head_dim: needs linear_key_heads above 0 (the gated DeltaNet)");
  refused(deltanet({{"attn_output_gate", true}}), "attn_output_gate: does not apply to the gated DeltaNet");
  refused(deltanet({{"sliding_window", 4}}), "sliding_window: does not apply to the gated DeltaNet");
  refused(deltanet({{"qk_norm", true}}), "qk_norm: does not apply to the gated DeltaNet");
  json no_dim = deltanet();
  no_dim.erase("linear_value_head_dim");
  refused(no_dim, "linear_value_head_dim");
}
