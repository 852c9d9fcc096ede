// The llama_block's options that carry DeepSeek's, GPT-OSS's, Llama 4's and Cohere's layers, each checked
// by a property of its own here (the arguments' refusals too), and against transformers in
// tests/hf_test.cpp (HfParity.DeepseekV3*, GptOss*, Llama4*, Cohere*).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "common/error.h"
#include "common/replayable.h"
#include "models/decoder.h"
#include "models/model.h"
#include "tests/layer_list_helpers.h"

using namespace pipetrain;
using nlohmann::json;

namespace {

models::Model build(json cfg, uint64_t seed = 3) { return test::build_model_section(cfg, seed); }
using test::build_error;
using test::llama_list;

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

}  // namespace

// DeepSeek's latent attention and sigmoid routing in a llama_block: the latent projections in the
// attention's place, counted before they are made as they are; the interleaved rotation is another
// model; the correction bias (a buffer) steers which experts are chosen but not their weights;
// the arguments are checked. Both against transformers: HfParity.DeepseekV3*.
TEST(LayerList, LatentAttentionAndSigmoidRoutingAreChecked) {
  auto block = [](const json& extra) { return llama_list(extra); };
  const json mla{{"kv_lora_rank", 8}, {"q_lora_rank", 10}, {"head_dim", 8}, {"rope_head_dim", 4}, {"v_head_dim", 5}, {"qkv_bias", true}};
  models::Model m = build(block(mla));
  auto params = m.layers->named_parameters();
  EXPECT_EQ(params["b.llama.self_attn.kv_b_proj.weight"].sizes(), (std::vector<int64_t>{4 * (4 + 5), 8}));
  EXPECT_EQ(params["b.llama.self_attn.kv_a_proj_with_mqa.bias"].sizes(), (std::vector<int64_t>{8 + 4}));
  EXPECT_EQ(params["b.llama.self_attn.o_proj.weight"].sizes(), (std::vector<int64_t>{16, 4 * 5}));
  EXPECT_FALSE(params.contains("b.llama.self_attn.k_proj.weight"));
  int64_t values = 0;
  for (const auto& p : params) values += p.key().rfind("b.", 0) == 0 ? p.value().numel() : 0;
  JsonReader r(block(mla)["layers"][1], "model.layers[1]", "test");
  EXPECT_EQ(models::parameter_values(models::read_llama_block(r)), double(values));
  const at::Tensor x = torch::randint(0, 20, {3, 6});
  json interleaved = mla;
  interleaved["rope_interleave"] = true;
  EXPECT_FALSE(torch::allclose(build(block(interleaved)).layers->forward(x), m.layers->forward(x)));  // same weights

  // 8 experts in 4 groups, the best 2 groups: a large bias on experts 0 and 1 (group 0) makes them
  // every token's two, weighted by their own sigmoid scores: 2 experts without a bias, the same.
  models::Model steered = build(block({{"experts", 8}, {"router", "sigmoid"}, {"router_bias", true}, {"expert_groups", 4},
                                       {"groups_per_token", 2}, {"normalize_experts", false}}));
  models::Model two = build(block({{"experts", 2}, {"router", "sigmoid"}, {"normalize_experts", false}}));
  EXPECT_FALSE(steered.layers->named_parameters().contains("b.llama.mlp.gate.e_score_correction_bias"));
  {
    torch::NoGradGuard no_grad;
    for (models::Model* n : {&steered, &two}) n->layers->to(torch::kDouble);
    auto s = steered.layers->named_parameters();
    steered.layers->named_buffers()["b.llama.mlp.gate.e_score_correction_bias"].narrow(0, 0, 2).fill_(100.0);
    for (auto& p : two.layers->named_parameters())
      p.value().copy_(p.key() == "b.llama.mlp.gate.weight" ? s[p.key()].narrow(0, 0, 2) : s[p.key()]);
  }
  EXPECT_LE((steered.layers->forward(x) - two.layers->forward(x)).abs().max().item<double>(), 1e-12);

  auto refused = [&](json extra, const std::string& expected) {
    const std::string error = build_error(block(std::move(extra)));
    EXPECT_NE(error.find(expected), std::string::npos) << error;
  };
  refused({{"kv_lora_rank", 8}}, "rope_head_dim: is required with kv_lora_rank");
  refused({{"q_lora_rank", 8}}, "q_lora_rank: needs kv_lora_rank above 0");
  refused({{"kv_lora_rank", 8}, {"rope_head_dim", 3}}, "rope_head_dim: must be even");
  refused({{"kv_lora_rank", 8}, {"rope_head_dim", 2}, {"n_kv_heads", 2}}, "n_kv_heads: must equal n_heads with latent attention");
  refused({{"kv_lora_rank", 8}, {"rope_head_dim", 2}, {"qk_norm", true}}, "qk_norm: is not supported with latent attention");
  refused({{"experts", 4}, {"router_bias", true}}, "router_bias: needs router \"sigmoid\"");
  refused({{"experts", 8}, {"router", "sigmoid"}, {"expert_groups", 3}}, "expert_groups: must divide experts (8) into groups of at least 2");
  refused({{"experts", 8}, {"router", "sigmoid"}, {"expert_groups", 4}, {"groups_per_token", 1}, {"experts_per_token", 3}},
          "groups_per_token: leaves fewer experts than experts_per_token (3)");
  refused({{"routed_scale", 2.0}}, "routed_scale: needs experts above 0");
  refused({{"kv_lora_rank", 8}, {"rope_head_dim", 2}, {"rope_pairs_kept", true}}, "rope_pairs_kept: needs rope_interleave");
  refused({{"experts", 8}, {"expert_groups", 3}}, "expert_groups: must divide experts (8)");
  EXPECT_EQ(build_error(block({{"experts", 8}, {"expert_groups", 8}, {"groups_per_token", 2}})), "(built)");  // DeepSeek-V2's softmax groups
}

// GPT-OSS's pieces in a llama_block: a sink far below every score changes nothing; the softmax of
// the chosen experts' logits alone is the softmax over all of them renormalized over the chosen;
// the sinks and the router's bias are counted before they are made; the arguments are checked.
// Against transformers: HfParity.GptOssSinksClampedSwigluStackedExperts.
TEST(LayerList, SinksTopSoftmaxAndTheClampedSwigluAreChecked) {
  auto block = [](const json& extra) { return llama_list(extra, {{"d_model", 16}, {"n_heads", 4}, {"n_kv_heads", 2}, {"d_ff", 24}}); };
  const at::Tensor x = torch::randint(0, 20, {3, 6});
  models::Model sunk = build(block({{"attn_sinks", true}})), plain = build(block({}));
  for (models::Model* m : {&sunk, &plain}) m->layers->to(torch::kDouble);
  {
    torch::NoGradGuard no_grad;
    auto p = plain.layers->named_parameters();
    for (auto& q : sunk.layers->named_parameters())
      if (p.contains(q.key())) q.value().copy_(p[q.key()]);
    sunk.layers->named_parameters()["b.llama.self_attn.sinks"].fill_(-1e4);
  }
  EXPECT_LE((sunk.layers->forward(x) - plain.layers->forward(x)).abs().max().item<double>(), 1e-12);
  {
    torch::NoGradGuard no_grad;
    sunk.layers->named_parameters()["b.llama.self_attn.sinks"].fill_(2.0);
  }
  EXPECT_FALSE(torch::allclose(sunk.layers->forward(x), plain.layers->forward(x)));

  const json oss{{"experts", 4}, {"router", "softmax_top"}, {"router_logit_bias", true}, {"act", "swiglu_oai"}, {"mlp_bias", true},
                 {"attn_sinks", true}};
  models::Model m = build(block(oss));
  int64_t values = 0;
  for (const auto& p : m.layers->named_parameters()) values += p.key().rfind("b.", 0) == 0 ? p.value().numel() : 0;
  JsonReader r(block(oss)["layers"][1], "model.layers[1]", "test");
  EXPECT_EQ(models::parameter_values(models::read_llama_block(r)), double(values));
  EXPECT_EQ(m.layers->named_parameters()["b.llama.mlp.gate.bias"].sizes(), (std::vector<int64_t>{4}));
  models::Model top = build(block({{"experts", 4}, {"router", "softmax_top"}})), all = build(block({{"experts", 4}}));
  for (models::Model* n : {&top, &all}) n->layers->to(torch::kDouble);
  EXPECT_LE((top.layers->forward(x) - all.layers->forward(x)).abs().max().item<double>(), 1e-12);  // the same weights (seed)
  EXPECT_FALSE(torch::allclose(build(block({{"act", "swiglu_oai"}})).layers->forward(x), build(block({})).layers->forward(x)));

  auto refused = [&](json extra, const std::string& expected) {
    const std::string error = build_error(block(std::move(extra)));
    EXPECT_NE(error.find(expected), std::string::npos) << error;
  };
  refused({{"swiglu_limit", 3.0}}, "swiglu_limit: needs act \"swiglu_oai\"");
  refused({{"experts", 4}, {"router", "softmax_top"}, {"expert_groups", 2}}, "expert_groups: needs router \"softmax\" or \"sigmoid\"");
  refused({{"router_logit_bias", true}}, "router_logit_bias: needs experts above 0");
  refused({{"n_kv_heads", 4}, {"kv_lora_rank", 8}, {"rope_head_dim", 2}, {"attn_sinks", true}}, "attn_sinks: is not supported with latent attention");
}

// Llama 4's pieces in a llama_block: chunked attention is each chunk's attention alone; the q/k
// norms without a weight make attention blind to the projections' scale; the query temperature is
// 1 until its floor; the top-k sigmoid router's weights scale the chosen experts' inputs (or
// their outputs without router_scales_input); the arguments are checked. Against transformers:
// HfParity.Llama4*.
TEST(LayerList, Llama4ChunksNormsTemperatureAndExpertsAreChecked) {
  auto block = [](const json& extra) { return llama_list(extra); };
  const at::Tensor x = torch::randint(0, 20, {3, 6});
  auto forward = [](models::Model& m, const at::Tensor& in) { return m.layers->forward(in); };
  // Chunks of 3 without rotary positions: each chunk's outputs are the block's on that chunk alone.
  models::Model chunked = build(block({{"rotary", false}, {"attention_chunk", 3}})), whole = build(block({{"rotary", false}}));
  for (models::Model* m : {&chunked, &whole}) m->layers->to(torch::kDouble);
  const at::Tensor out = forward(chunked, x);
  for (int64_t c : {0, 3}) EXPECT_LE(max_diff(out.narrow(1, c, 3), forward(chunked, x.narrow(1, c, 3))), 1e-12) << c;
  EXPECT_LE(max_diff(out.narrow(1, 0, 3), forward(whole, x).narrow(1, 0, 3)), 1e-12);
  EXPECT_GT(max_diff(out.narrow(1, 3, 3), forward(whole, x).narrow(1, 3, 3)), 1e-3);  // the second chunk sees the first without

  // Queries and keys RMS-normalized without a weight: scaling their projections changes nothing.
  for (bool normed : {true, false}) {
    models::Model m = build(block({{"qk_l2_norm", normed}, {"eps", 1e-12}, {"rope_interleave", true}, {"rope_pairs_kept", true}}));
    m.layers->to(torch::kDouble);
    const at::Tensor before = forward(m, x);
    {
      torch::NoGradGuard no_grad;
      for (const char* p : {"b.llama.self_attn.q_proj.weight", "b.llama.self_attn.k_proj.weight"}) m.layers->named_parameters()[p].mul_(3.0);
    }
    if (normed) EXPECT_LE(max_diff(before, forward(m, x)), 1e-9);
    else EXPECT_GT(max_diff(before, forward(m, x)), 1e-3);
  }
  // Interleaved pairs rotated are another model (the same weights).
  models::Model interleaved = build(block({{"rope_interleave", true}})), halves = build(block({}));
  EXPECT_GT(max_diff(forward(interleaved, x), forward(halves, x)), 1e-4);

  // The temperature 1 + 0.5·log(1 + floor((position + 1) / floor)): 1 on 6 positions with a floor of 7.
  auto nope = [&](const json& extra) {
    json e = extra;
    e["rotary"] = false;
    models::Model m = build(block(e));
    m.layers->to(torch::kDouble);
    return forward(m, x);
  };
  EXPECT_EQ(max_diff(nope({{"q_temperature", 0.5}, {"q_temperature_floor", 7}}), nope({})), 0.0);
  EXPECT_GT(max_diff(nope({{"q_temperature", 0.5}, {"q_temperature_floor", 2}}), nope({})), 1e-4);

  // The top-k sigmoid router, its weights on the inputs and on the outputs, against the experts run by hand.
  for (bool inputs : {true, false}) {
    models::LlamaBlockOptions o;
    o.d_model = 8;
    o.d_ff = 12;
    o.experts = 3;
    o.experts_per_token = 2;
    o.router_top_sigmoid = true;
    o.router_scales_input = inputs;
    models::Moe moe(o);
    moe->to(torch::kDouble);
    const at::Tensor h = torch::randn({5, 8}, torch::kDouble);
    const auto [top, chosen] = torch::matmul(h, moe->gate->weight.t()).topk(2, -1);
    at::Tensor expected = torch::zeros_like(h);
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t r = 0; r < 2; ++r) {
        auto& expert = *moe->experts[chosen[t][r].item<int64_t>()]->as<models::GatedMlpImpl>();
        const at::Tensor s = top[t][r].sigmoid(), row = h[t].unsqueeze(0);
        expected[t] += (inputs ? expert.forward(row * s) : expert.forward(row) * s).squeeze(0);
      }
    EXPECT_LE(max_diff(moe->forward(h), expected), 1e-12) << inputs;
  }

  auto refused = [&](json extra, const std::string& expected) {
    const std::string error = build_error(block(std::move(extra)));
    EXPECT_NE(error.find(expected), std::string::npos) << error;
  };
  refused({{"rope_interleave", true}, {"rotary", false}}, "rope_interleave: needs rotary true");
  refused({{"experts", 4}, {"router", "sigmoid_top"}, {"normalize_experts", true}}, "normalize_experts: is not read with router \"sigmoid_top\"");
  refused({{"experts", 4}, {"router", "sigmoid_top"}, {"expert_groups", 2}}, "expert_groups: needs router \"softmax\" or \"sigmoid\"");
  refused({{"q_temperature_floor", 4}}, "q_temperature_floor: needs q_temperature above 0");
  refused({{"router_scales_input", true}}, "router_scales_input: needs experts above 0");
  refused({{"kv_lora_rank", 8}, {"rope_head_dim", 2}, {"qk_l2_norm", true}}, "qk_l2_norm: is not supported with latent attention");
  refused({{"kv_lora_rank", 8}, {"rope_head_dim", 2}, {"q_temperature", 0.1}}, "q_temperature: is not supported with latent attention");
}

// The experts' products as grouped GEMMs (experts_kernel "grouped") equal the expert-by-expert
// loop, forward and every parameter's gradient, in float32 and bfloat16, for each router (the
// softmax; DeepSeek-V3's sigmoid in groups with a shared expert; GPT-OSS's top softmax with biases
// and its clamped SwiGLU; Llama 4's sigmoid scaling the inputs) and with experts left without a
// token; they say nothing a CUDA graph could not replay, where the loop says it reads its routing
// on the host; float64 (which torch's grouped GEMM does not take) and rows of a width the kernel
// cannot take run the loop and say why.
TEST(LayerList, GroupedExpertsEqualTheLoop) {
  const std::vector<json> routers{
      {{"experts", 4}},
      {{"experts", 8}, {"router", "sigmoid"}, {"router_bias", true}, {"expert_groups", 4}, {"groups_per_token", 2}, {"shared_expert", 8}},
      {{"experts", 4}, {"router", "softmax_top"}, {"router_logit_bias", true}, {"act", "swiglu_oai"}, {"mlp_bias", true}},
      {{"experts", 4}, {"router", "sigmoid_top"}, {"router_scales_input", true}, {"experts_per_token", 1}},
      {{"experts", 16}, {"experts_per_token", 1}}};  // 18 tokens, 16 experts: some without one
  const at::Tensor x = torch::randint(0, 20, {3, 6});
  for (const json& router : routers)
    for (const at::ScalarType type : {at::kFloat, at::kBFloat16}) {
      json grouped = router;
      grouped["experts_kernel"] = "grouped";
      models::Model a = build(llama_list(router)), b = build(llama_list(grouped));  // the same weights (seed)
      const std::string what = router.dump() + " " + c10::toString(type);
      a.layers->to(type);
      b.layers->to(type);
      take_not_replayable();
      const at::Tensor ya = a.layers->forward(x);
      EXPECT_NE(take_not_replayable().find("reads its routing on the host"), std::string::npos) << what;
      const at::Tensor yb = b.layers->forward(x);
      EXPECT_EQ(take_not_replayable(), "") << what;
      const double tol = type == at::kFloat ? 1e-5 : 1.0 / 32;
      EXPECT_LE(max_diff(ya.to(at::kFloat), yb.to(at::kFloat)), tol) << what;
      const at::Tensor g = torch::randn(ya.sizes()).to(type);
      (ya * g).sum().backward();
      (yb * g).sum().backward();
      auto pb = b.layers->named_parameters();
      int checked = 0;
      for (const auto& p : a.layers->named_parameters()) {
        const at::Tensor ga = p.value().grad(), gb = pb[p.key()].grad();
        ASSERT_TRUE(gb.defined() || !ga.defined()) << what << " " << p.key();
        const at::Tensor want = ga.defined() ? ga : torch::zeros_like(gb);  // an expert without a token
        EXPECT_LE(max_diff(want.to(at::kFloat), gb.to(at::kFloat)), tol * std::max(1.0, want.abs().max().item<double>()))
            << what << " " << p.key();
        ++checked;
      }
      EXPECT_GT(checked, 10) << what;
    }

  json grouped{{"experts", 4}, {"experts_kernel", "grouped"}};
  models::Model wide = build(llama_list(grouped)), loop = build(llama_list({{"experts", 4}}));
  for (models::Model* m : {&wide, &loop}) m->layers->to(torch::kDouble);
  take_not_replayable();
  EXPECT_TRUE(torch::equal(wide.layers->forward(x), loop.layers->forward(x)));
  EXPECT_NE(take_not_replayable().find("grouped experts: torch's grouped GEMM takes no Double"), std::string::npos);
  models::Model odd = build(llama_list(grouped, {{"d_model", 16}, {"n_heads", 4}, {"d_ff", 6}}));  // 24 bytes a row
  odd.layers->forward(x);
  EXPECT_NE(take_not_replayable().find("needs rows of a multiple of 16 bytes (d_model 16 and d_ff 6 of Float)"), std::string::npos);
  EXPECT_NE(build_error(llama_list({{"experts_kernel", "grouped"}})).find("experts_kernel: needs experts above 0"), std::string::npos);
  EXPECT_NE(build_error(llama_list({{"experts", 4}, {"experts_kernel", "fused"}})).find("experts_kernel"), std::string::npos);
}

// Arcee's MLP in a llama_block: without a gate (mlp_gate false) it is down(relu(up(x))²), its
// up_proj and down_proj alone, counted before they are made; relu² in a gated MLP takes SiLU's
// place; the arguments are checked. Against transformers: HfParity.ArceeReluSquaredMlp*.
TEST(LayerList, AnMlpWithoutAGateAndReluSquaredAreChecked) {
  const json plain{{"mlp_gate", false}, {"act", "relu2"}, {"mlp_bias", true}};
  models::Model m = build(llama_list(plain));
  auto params = m.layers->named_parameters();
  EXPECT_FALSE(params.contains("b.llama.mlp.gate_proj.weight"));
  EXPECT_EQ(params["b.llama.mlp.up_proj.bias"].sizes(), (std::vector<int64_t>{24}));
  int64_t values = 0;
  for (const auto& p : params) values += p.key().rfind("b.", 0) == 0 ? p.value().numel() : 0;
  JsonReader r(llama_list(plain)["layers"][1], "model.layers[1]", "test");
  EXPECT_EQ(models::parameter_values(models::read_llama_block(r)), double(values));
  const at::Tensor x = torch::randn({5, 16}, torch::kDouble);
  models::GatedMlpImpl mlp(16, 24, /*bias=*/true, models::Gelu::None, 0, 0, /*relu2=*/true, /*gated=*/false);
  mlp.to(torch::kDouble);
  const at::Tensor up = x.matmul(mlp.up_proj->weight.t()) + mlp.up_proj->bias;
  const at::Tensor want = (up.clamp_min(0) * up.clamp_min(0)).matmul(mlp.down_proj->weight.t()) + mlp.down_proj->bias;
  EXPECT_LE(max_diff(mlp.forward(x), want), 1e-12);
  models::GatedMlpImpl gated(16, 24, /*bias=*/false, models::Gelu::None, 0, 0, /*relu2=*/true);
  gated.to(torch::kDouble);
  const at::Tensor g = x.matmul(gated.gate_proj->weight.t());
  EXPECT_LE(max_diff(gated.forward(x), (g.relu().square() * x.matmul(gated.up_proj->weight.t())).matmul(gated.down_proj->weight.t())), 1e-12);
  // xIELU (Apertus's): its two trained scalars, counted; a·x² + x/2 above 0, (expm1(min(x, eps)) − x)·b + x/2 below.
  const json xielu{{"mlp_gate", false}, {"act", "xielu"}};
  models::Model ap = build(llama_list(xielu));
  values = 0;
  for (const auto& p : ap.layers->named_parameters()) values += p.key().rfind("b.", 0) == 0 ? p.value().numel() : 0;
  JsonReader rx(llama_list(xielu)["layers"][1], "model.layers[1]", "test");
  EXPECT_EQ(models::parameter_values(models::read_llama_block(rx)), double(values));
  EXPECT_EQ(ap.layers->named_parameters()["b.llama.mlp.act_fn.alpha_p"].sizes(), (std::vector<int64_t>{1}));
  models::Xielu act;
  act->to(torch::kDouble);
  const double a = std::log1p(std::exp(act->alpha_p.item<double>())), b = 0.5 + std::log1p(std::exp(act->alpha_n.item<double>()));
  const at::Tensor v = torch::tensor({-3.0, -1e-7, 0.0, 2.0}, torch::kDouble);
  const at::Tensor want_v = torch::tensor({(std::expm1(-3.0) + 3.0) * b - 1.5, (std::expm1(-1e-6) + 1e-7) * b - 0.5e-7, (std::expm1(-1e-6) - 0.0) * b,
                                           a * 4 + 1.0}, torch::kDouble);
  EXPECT_LE(max_diff(act->forward(v), want_v), 1e-12);
  EXPECT_NE(build_error(llama_list({{"act", "xielu"}})).find("act: \"xielu\" needs mlp_gate false"), std::string::npos);
  EXPECT_NE(build_error(llama_list({{"mlp_gate", false}, {"experts", 4}})).find("mlp_gate: false with experts needs act \"relu2\" (Nemotron-H's experts)"), std::string::npos);
  EXPECT_NE(build_error(llama_list({{"mlp_gate", false}, {"act", "swiglu_oai"}})).find("mlp_gate: false needs an act other than \"swiglu_oai\""), std::string::npos);
}

// Hunyuan's q/k norms on the rotated heads (qk_norm_after_rope): without rotary positions they are
// the norms before (the same weights), with them another model; the argument is checked. Against
// transformers: HfParity.HunyuanQkNormsAfterTheRotation*.
TEST(LayerList, QkNormsAfterTheRotationAreChecked) {
  const at::Tensor x = torch::randint(0, 20, {3, 6});
  auto forward = [&](const json& extra) {
    models::Model m = build(llama_list(extra));  // the same weights (seed)
    m.layers->to(torch::kDouble);
    {
      torch::NoGradGuard no_grad;  // norms' weights away from 1, so that their place shows
      for (auto& p : m.layers->named_parameters())
        if (p.key().find("_norm.weight") != std::string::npos) p.value().copy_(torch::linspace(0.5, 1.5, p.value().numel(), torch::kDouble));
    }
    return m.layers->forward(x);
  };
  EXPECT_LE(max_diff(forward({{"qk_norm", true}, {"qk_norm_after_rope", true}, {"rotary", false}}), forward({{"qk_norm", true}, {"rotary", false}})), 1e-12);
  EXPECT_GT(max_diff(forward({{"qk_norm", true}, {"qk_norm_after_rope", true}}), forward({{"qk_norm", true}})), 1e-3);
  EXPECT_NE(build_error(llama_list({{"qk_norm_after_rope", true}})).find("qk_norm_after_rope: needs qk_norm over each head"), std::string::npos);
  EXPECT_NE(build_error(llama_list({{"qk_norm", true}, {"qk_norm_over", "projection"}, {"qk_norm_after_rope", true}}))
                .find("qk_norm_after_rope: needs qk_norm over each head"),
            std::string::npos);
}

// Cohere's block: one norm feeding attention and the MLP side by side (norms "parallel"), the
// block's norms centered (norm_center: LayerNorms without a bias), counted before they are made.
// The parallel block is the attention block plus the MLP block of the same weights, less the input
// they share; a centered rmsnorm is torch's layer_norm without a bias; the rotation's tables
// rounded to the type before the float32 products (rope_tables_rounded) change nothing in float64
// and round otherwise in bfloat16. Against transformers: HfParity.Cohere*.
TEST(LayerList, ParallelBlocksCenteredNormsAndRoundedTablesAreChecked) {
  const json centered{{"norm_center", true}, {"norm_scale", "before_cast"}};
  json parallel = centered;
  parallel["norms"] = "parallel";
  models::Model p = build(llama_list(parallel));
  EXPECT_FALSE(p.layers->named_parameters().contains("b.llama.post_attention_layernorm.weight"));
  JsonReader r(llama_list(parallel)["layers"][1], "model.layers[1]", "test");
  EXPECT_EQ(models::parameter_values(models::read_llama_block(r)), double(test::block_values(p)));
  json mixer_alone = centered, mlp_alone = centered;
  mixer_alone["mlp"] = false;
  mlp_alone["mixer"] = false;
  models::Model attention = build(llama_list(mixer_alone)), mlp = build(llama_list(mlp_alone));
  for (models::Model* m : {&p, &attention, &mlp}) m->layers->to(torch::kDouble);
  {
    torch::NoGradGuard no_grad;
    auto from = p.layers->named_parameters();
    from["b.llama.input_layernorm.weight"].copy_(torch::linspace(0.5, 1.5, 16, torch::kDouble));  // away from 1
    for (models::Model* m : {&attention, &mlp})
      for (auto& q : m->layers->named_parameters()) {
        const std::string key = q.key() == "b.llama.post_attention_layernorm.weight" ? "b.llama.input_layernorm.weight" : q.key();
        ASSERT_TRUE(from.contains(key)) << key;
        q.value().copy_(from[key]);
      }
  }
  const at::Tensor ids = torch::randint(0, 20, {2, 6});
  const at::Tensor embedded = p.layers->named_parameters()["e.embedding.weight"].index_select(0, ids.flatten()).view({2, 6, 16});
  EXPECT_LE(max_diff(p.layers->forward(ids) + embedded, attention.layers->forward(ids) + mlp.layers->forward(ids)), 1e-12);
  models::RmsNormImpl norm(std::vector<int64_t>{16}, 1e-5, models::RmsScale::AfterCast, /*center=*/true);
  norm.to(torch::kDouble);
  {
    torch::NoGradGuard no_grad;
    norm.weight.copy_(torch::linspace(0.5, 1.5, 16, torch::kDouble));
  }
  const at::Tensor v = torch::randn({3, 16}, torch::kDouble) * 3 + 2;
  EXPECT_LE(max_diff(norm.forward(v), at::layer_norm(v, {16}, norm.weight, {}, 1e-5)), 1e-12);
  auto forward = [&](const json& extra, at::ScalarType type) {
    models::Model m = build(llama_list(extra));  // the same weights (seed)
    m.layers->to(type);
    return m.layers->forward(ids).to(torch::kDouble);
  };
  const json float32_rotation{{"rope_float32", true}}, rounded{{"rope_float32", true}, {"rope_tables_rounded", true}};
  EXPECT_TRUE(torch::equal(forward(rounded, torch::kDouble), forward(float32_rotation, torch::kDouble)));
  EXPECT_GT(max_diff(forward(rounded, torch::kBFloat16), forward(float32_rotation, torch::kBFloat16)), 0);
  EXPECT_NE(build_error(llama_list({{"rope_tables_rounded", true}})).find("rope_tables_rounded: needs rope_float32 true"), std::string::npos);
  EXPECT_NE(build_error(llama_list({{"norms", "parallel"}, {"mixer", false}})).find("mixer: false needs norms \"pre\""), std::string::npos);
}

// Command R+'s q/k norms (qk_norm_over "each_head"): each head normalized over its own values with
// a weight of its own, [n_heads, head_dim] and [n_kv_heads, head_dim], counted before they are
// made, centered with norm_center. With every head's weight the same, the block equals Qwen3's
// (one weight for all heads) in float64; one key head's weight changed, the output changes; the
// norm over [heads, head_dim] is torch's layer_norm over each head times its row. Against transformers:
// HfParity.CohereQkNormsOfEachHeadItsOwnWeights.
TEST(LayerList, QkNormsOfEachHeadHaveWeightsOfTheirOwn) {
  auto block = [](const json& extra) { return llama_list(extra, {{"d_model", 16}, {"n_heads", 4}, {"n_kv_heads", 2}, {"d_ff", 24}}); };
  const json each{{"qk_norm", true}, {"qk_norm_over", "each_head"}, {"norm_center", true}};
  models::Model m = build(block(each)), shared = build(block({{"qk_norm", true}, {"norm_center", true}}));
  auto params = m.layers->named_parameters();
  EXPECT_EQ(params["b.llama.self_attn.q_norm.weight"].sizes(), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(params["b.llama.self_attn.k_norm.weight"].sizes(), (std::vector<int64_t>{2, 4}));
  JsonReader r(block(each)["layers"][1], "model.layers[1]", "test");
  EXPECT_EQ(models::parameter_values(models::read_llama_block(r)), double(test::block_values(m)));
  for (models::Model* x : {&m, &shared}) x->layers->to(torch::kDouble);
  const at::Tensor w = torch::linspace(0.5, 1.5, 4, torch::kDouble);
  {
    torch::NoGradGuard no_grad;
    auto from = shared.layers->named_parameters();
    for (auto& q : params) {
      if (q.key().find("_norm.weight") != std::string::npos && q.key().find("self_attn") != std::string::npos) {
        q.value().copy_(w.expand(q.value().sizes()));
        from[q.key()].copy_(w);
      } else {
        q.value().copy_(from[q.key()]);
      }
    }
  }
  const at::Tensor ids = torch::randint(0, 20, {2, 6});
  const at::Tensor before = m.layers->forward(ids);
  EXPECT_LE(max_diff(before, shared.layers->forward(ids)), 1e-12);
  {
    torch::NoGradGuard no_grad;
    params["b.llama.self_attn.k_norm.weight"][1].mul_(2);  // the second key head's own weight
  }
  EXPECT_GT(max_diff(m.layers->forward(ids), before), 1e-6);
  models::RmsNormImpl norm(std::vector<int64_t>{2, 4}, 1e-5, models::RmsScale::AfterCast, /*center=*/true, /*norm_dims=*/1);
  norm.to(torch::kDouble);
  {
    torch::NoGradGuard no_grad;
    norm.weight.copy_(torch::linspace(0.5, 1.5, 8, torch::kDouble).view({2, 4}));
  }
  const at::Tensor v = torch::randn({3, 2, 4}, torch::kDouble) * 3 + 2;
  EXPECT_LE(max_diff(norm.forward(v), at::layer_norm(v, {4}, {}, {}, 1e-5) * norm.weight), 1e-12);
  EXPECT_NE(build_error(llama_list({{"qk_norm_over", "each_head"}})).find("qk_norm_over: needs qk_norm true"), std::string::npos);
}

// StarCoder2's norms (norm_bias with norm_center): torch's LayerNorm, a weight and a bias,
// counted before they are made; the rmsnorm layer's `bias` likewise; a bias without centering
// refused. Against transformers: HfParity.Starcoder2*.
TEST(LayerList, NormsWithABiasAreTorchsLayerNorm) {
  const json layer_norms{{"norm_center", true}, {"norm_bias", true}};
  models::Model m = build(llama_list(layer_norms));
  auto params = m.layers->named_parameters();
  EXPECT_EQ(params["b.llama.input_layernorm.bias"].sizes(), (std::vector<int64_t>{16}));
  EXPECT_EQ(params["b.llama.post_attention_layernorm.bias"].sizes(), (std::vector<int64_t>{16}));
  JsonReader r(llama_list(layer_norms)["layers"][1], "model.layers[1]", "test");
  EXPECT_EQ(models::parameter_values(models::read_llama_block(r)), double(test::block_values(m)));
  models::RmsNormImpl norm(std::vector<int64_t>{16}, 1e-5, models::RmsScale::BeforeCast, /*center=*/true, 0, /*bias=*/true);
  {
    torch::NoGradGuard no_grad;
    norm.weight.copy_(torch::linspace(0.5, 1.5, 16));
    norm.bias.copy_(torch::linspace(-1, 1, 16));
  }
  for (const auto type : {torch::kDouble, torch::kFloat, torch::kBFloat16}) {
    norm.to(type);
    const at::Tensor v = (torch::randn({3, 16}, torch::kDouble) * 3 + 2).to(type);
    EXPECT_TRUE(torch::equal(norm.forward(v), at::layer_norm(v, {16}, norm.weight, norm.bias, 1e-5))) << type;
  }
  EXPECT_NE(build_error(llama_list({{"norm_bias", true}})).find("norm_bias: needs norm_center true (a LayerNorm)"), std::string::npos);
  const json rms_bias{{"family", "layers"}, {"input_shape", {4, 16}},
                      {"layers", {{{"name", "n"}, {"type", "rmsnorm"}, {"normalized_shape", 16}, {"center", true}, {"bias", true}}}}};
  EXPECT_TRUE(build(rms_bias).layers->named_parameters().contains("n.rms.bias"));
  json uncentered = rms_bias;
  uncentered["layers"][0].erase("center");
  EXPECT_NE(build_error(uncentered).find("bias: needs center true (a LayerNorm)"), std::string::npos) << build_error(uncentered);
}

// A block's dropout (StarCoder2's and Seed-OSS's): nothing in evaluation (the block without it,
// the same weights), keyed masks in training; refused where its place is not defined.
TEST(LayerList, BlockDropoutActsInTrainingAlone) {
  const at::Tensor ids = torch::randint(0, 20, {2, 6});
  models::Model dropping = build(llama_list({{"dropout", 0.3}, {"attn_dropout", 0.2}})), plain = build(llama_list({}));
  for (models::Model* m : {&dropping, &plain}) m->layers->to(torch::kDouble);
  {
    torch::NoGradGuard no_grad;
    auto from = plain.layers->named_parameters();
    for (auto& p : dropping.layers->named_parameters()) p.value().copy_(from[p.key()]);
  }
  dropping.layers->eval();
  plain.layers->eval();
  EXPECT_TRUE(torch::equal(dropping.layers->forward(ids), plain.layers->forward(ids)));
  dropping.layers->train();
  plain.layers->train();
  EXPECT_GT(max_diff(dropping.layers->forward(ids), plain.layers->forward(ids)), 1e-3);
  EXPECT_NE(build_error(llama_list({{"dropout", 0.1}, {"norms", "post"}})).find("dropout: above 0 needs a plain block"), std::string::npos);
  EXPECT_NE(build_error(llama_list({{"attn_dropout", 0.1}, {"attn_sinks", true}})).find("attn_dropout: above 0 needs a plain block"),
            std::string::npos);
}

// Attention beside the MLP: GPT-NeoX's two norms (parallel_two) are Cohere's one (parallel) where
// their weights are equal, and not otherwise; the sum's order (parallel_sum) moves only roundings;
// the parallel blocks drop in training alone (Phi's resid_pdrop, GPT-NeoX's hidden_dropout).
TEST(LayerList, ParallelBranchesWithOneOrTwoNormsAndTheirDropout) {
  const json ln{{"norm_center", true}, {"norm_bias", true}};
  auto with = [&](json extra) {
    extra.update(ln);
    models::Model m = build(llama_list(extra));
    m.layers->to(torch::kDouble);
    m.layers->eval();
    return m;
  };
  const at::Tensor ids = torch::randint(0, 20, {2, 6});
  models::Model one = with({{"norms", "parallel"}}), two = with({{"norms", "parallel_two"}}), branches = with({{"norms", "parallel_two"}, {"parallel_sum", "branches_first"}});
  models::Model seq = with({});
  torch::NoGradGuard no_grad;
  auto from = one.layers->named_parameters();
  for (models::Model* m : {&two, &branches, &seq}) {
    auto params = m->layers->named_parameters();
    for (auto& p : params) {
      const std::string name = p.key();
      const std::string own = name.find("post_attention_layernorm") != std::string::npos
                                  ? name.substr(0, name.find("post_attention_layernorm")) + "input_layernorm" + name.substr(name.find(".", name.find("post_attention_layernorm")))
                                  : name;
      p.value().copy_(from[own]);
    }
  }
  EXPECT_LE(max_diff(two.layers->forward(ids), one.layers->forward(ids)), 1e-12);
  EXPECT_LE(max_diff(branches.layers->forward(ids), one.layers->forward(ids)), 1e-12);
  EXPECT_GT(max_diff(seq.layers->forward(ids), one.layers->forward(ids)), 1e-3);  // one after the other is another model
  for (auto& p : two.layers->named_parameters())
    if (p.key().find("post_attention_layernorm.weight") != std::string::npos) p.value().mul_(1.5);
  EXPECT_GT(max_diff(two.layers->forward(ids), one.layers->forward(ids)), 1e-3);  // the MLP's own norm is read
  // Dropout beside parallel branches: nothing in eval, both branches' outputs in training.
  for (const char* norms : {"parallel", "parallel_two"}) {
    models::Model dropping = with({{"norms", norms}, {"dropout", 0.3}}), plain = with({{"norms", norms}});
    auto same = plain.layers->named_parameters();
    for (auto& p : dropping.layers->named_parameters()) p.value().copy_(same[p.key()]);
    EXPECT_TRUE(torch::equal(dropping.layers->forward(ids), plain.layers->forward(ids))) << norms;
    dropping.layers->train();
    EXPECT_GT(max_diff(dropping.layers->forward(ids), plain.layers->forward(ids)), 1e-3) << norms;
  }
  EXPECT_NE(build_error(llama_list({{"parallel_sum", "branches_first"}})).find("parallel_sum: needs norms \"parallel\" or \"parallel_two\""),
            std::string::npos);
  EXPECT_NE(build_error(llama_list({{"qk_norm_bias", true}, {"norm_center", true}})).find("qk_norm_bias: needs qk_norm"), std::string::npos);
}

// The GELUs of transformers' activations: gelu_new is the tanh approximation (torch's, 1e-15 in
// float64), gelu_fast nearly so, both near the exact GELU and not it.
TEST(LayerList, TheGelusAreTransformersApproximations) {
  const at::Tensor x = torch::linspace(-6, 6, 1001, torch::kDouble);
  const at::Tensor exact = models::apply_gelu(models::Gelu::Erf, x);
  EXPECT_TRUE(torch::equal(exact, torch::gelu(x)));
  EXPECT_LE(max_diff(models::apply_gelu(models::Gelu::New, x), torch::gelu(x, "tanh")), 1e-15);
  EXPECT_LE(max_diff(models::apply_gelu(models::Gelu::Fast, x), torch::gelu(x, "tanh")), 1e-9);
  for (models::Gelu g : {models::Gelu::New, models::Gelu::Fast}) {
    EXPECT_LE(max_diff(models::apply_gelu(g, x), exact), 1e-3);
    EXPECT_GT(max_diff(models::apply_gelu(g, x), exact), 1e-5);
  }
  // A block's act names them: an MLP without a gate through each.
  for (const char* act : {"gelu", "gelu_new", "gelu_fast"}) EXPECT_EQ(build_error(llama_list({{"act", act}, {"mlp_gate", false}})), "(built)") << act;
}

// How grouped heads reach the fused attention (kv_heads) and a bias added after its product
// (bias_apart) move only roundings: 1e-12 apart in float64. Broadcast takes one key head alone.
TEST(LayerList, KvHeadsAndBiasApartMoveOnlyRoundings) {
  const at::Tensor ids = torch::randint(0, 20, {2, 6});
  auto same = [&](const json& a, const json& b) {
    models::Model x = build(llama_list(a)), y = build(llama_list(b));  // the same weights (seed)
    x.layers->to(torch::kDouble);
    y.layers->to(torch::kDouble);
    return max_diff(x.layers->forward(ids), y.layers->forward(ids));
  };
  EXPECT_LE(same({{"n_kv_heads", 2}}, {{"n_kv_heads", 2}, {"kv_heads", "repeated"}}), 1e-12);
  EXPECT_LE(same({{"n_kv_heads", 1}}, {{"n_kv_heads", 1}, {"kv_heads", "broadcast"}}), 1e-12);
  EXPECT_LE(same({{"qkv_bias", true}, {"o_bias", true}, {"mlp_bias", true}},
                 {{"qkv_bias", true}, {"o_bias", true}, {"mlp_bias", true}, {"bias_apart", true}}), 1e-12);
  EXPECT_NE(build_error(llama_list({{"n_kv_heads", 2}, {"kv_heads", "broadcast"}})).find("kv_heads: \"broadcast\" needs n_kv_heads 1"),
            std::string::npos);
  EXPECT_NE(build_error(llama_list({{"bias_apart", true}, {"experts", 4}})).find("bias_apart: needs attention of its own and one MLP"),
            std::string::npos);
}

// The blocks of the families side by side counted before they are made as they are made: GPT-NeoX's
// two norms, Phi's q/k LayerNorms with biases, StableLM's per-head ones, Falcon's and GPT-BigCode's.
TEST(LayerList, ParallelFamiliesBlocksAreCountedAsMade) {
  const json ln{{"norm_center", true}, {"norm_bias", true}, {"mlp_gate", false}, {"mlp_bias", true}, {"act", "gelu"}};
  for (json extra : {json{{"norms", "parallel_two"}, {"parallel_sum", "branches_first"}, {"qkv_bias", true}, {"o_bias", true}},
                     json{{"norms", "parallel"}, {"qk_norm", true}, {"qk_norm_bias", true}, {"partial_rotary_factor", 0.5}},
                     json{{"norms", "parallel"}, {"qk_norm", true}, {"qk_norm_over", "each_head"}, {"n_kv_heads", 2}},
                     json{{"n_kv_heads", 1}, {"kv_heads", "broadcast"}, {"bias_apart", true}, {"qkv_bias", true}},
                     json{{"rotary", false}, {"n_kv_heads", 1}, {"dropout", 0.1}}}) {
    extra.update(ln);
    const models::Model m = build(llama_list(extra));
    JsonReader r(llama_list(extra)["layers"][1], "model.layers[1]", "test");
    EXPECT_EQ(models::parameter_values(models::read_llama_block(r)), double(test::block_values(m))) << extra.dump();
  }
}
