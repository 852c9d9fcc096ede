// The mixtures of experts of the `hf` family's Llama-family architectures (hf_fields.h): which
// layers hold one, the llama_block arguments it takes, and its tensors' two names.
#include <string>
#include <utility>
#include <vector>

#include "models/hf_fields.h"

namespace pipetrain::models::hf_detail {

using json = nlohmann::json;

namespace {

// output_router_logits: the router's auxiliary loss would join the training loss.
void refuse_router_logits(const Fields& f) {
  if (f.boolean("output_router_logits", false))
    f.fail("output_router_logits", "true is not supported (the router's auxiliary loss is not part of the training loss here)");
}

// DeepSeek-V3's and GLM-4.5's (with its own defaults): every layer from first_k_dense_replace on;
// n_routed_experts of moe_intermediate_size chosen by sigmoid scores with their correction bias
// within the topk_group best of n_group groups, renormalized (norm_topk_prob) and scaled
// (routed_scaling_factor); its shared experts one MLP of n_shared_experts times the width, without a gate.
Experts sigmoid_experts(const std::string& arch, const Fields& f, int64_t n) {
  Experts x;
  const bool glm = arch == kGlm4Moe;
  const int64_t big = int64_t{1} << 30;
  const int64_t count = f.integer("n_routed_experts", glm ? 128 : 256, 1, 1 << 16), k = f.integer("num_experts_per_tok", 8, 1, count);
  const int64_t groups = f.integer("n_group", glm ? 1 : 8, 1, count), best = f.integer("topk_group", glm ? 1 : 4, 1, groups);
  if (count % groups || (groups > 1 && count / groups < 2))
    f.fail("n_group", detail::concat("must divide n_routed_experts (", count, ") into groups of at least 2"));
  if (best * (count / groups) < k) f.fail("topk_group", detail::concat("leaves fewer experts than num_experts_per_tok (", k, ") to choose from"));
  refuse_router_logits(f);
  const int64_t width = f.integer("moe_intermediate_size", glm ? 1408 : 2048, 1, big), shared = f.integer("n_shared_experts", 1, 1, 1 << 16);
  const double scale = f.number("routed_scaling_factor", glm ? 1.0 : 2.5);
  if (!(scale > 0)) f.fail("routed_scaling_factor", "must be above 0");
  x.args = {{"experts", count}, {"experts_per_token", k}, {"normalize_experts", f.boolean("norm_topk_prob", true)},
            {"router", "sigmoid"}, {"router_bias", true}, {"expert_groups", groups}, {"groups_per_token", best},
            {"routed_scale", scale}, {"router_float32", true}, {"d_ff", width}, {"shared_expert", width * shared},
            {"shared_expert_gate", false}};
  const int64_t dense = f.integer("first_k_dense_replace", glm ? 1 : 3, 0, big);
  x.layers.assign(static_cast<size_t>(n), false);
  for (int64_t i = dense; i < n; ++i) x.layers[static_cast<size_t>(i)] = true;
  return x;
}

// DeepSeek-V2's: every layer from first_k_dense_replace on; n_routed_experts of
// moe_intermediate_size, the top num_experts_per_tok by the softmax (topk_method greedy) or within
// the topk_group of n_group groups of highest best score (group_limited_greedy), not renormalized,
// scaled by routed_scaling_factor; its shared experts as DeepSeek-V3's.
Experts deepseek_v2_experts(const Fields& f, int64_t n) {
  Experts x;
  const int64_t big = int64_t{1} << 30;
  const int64_t count = f.integer("n_routed_experts", 64, 1, 1 << 16), k = f.integer("num_experts_per_tok", 0, 1, count, true);
  const std::string method = f.string("topk_method", "greedy");
  if (method != "greedy" && method != "group_limited_greedy") f.fail("topk_method", "'" + method + "' is not supported (greedy, group_limited_greedy)");
  refuse_router_logits(f);
  const int64_t width = f.integer("moe_intermediate_size", 1407, 1, big), shared = f.integer("n_shared_experts", 2, 1, 1 << 16);
  const double scale = f.number("routed_scaling_factor", 1.0);
  if (!(scale > 0)) f.fail("routed_scaling_factor", "must be above 0");
  x.args = {{"experts", count}, {"experts_per_token", k}, {"normalize_experts", false}, {"routed_scale", scale},
            {"router_float32", true}, {"d_ff", width}, {"shared_expert", width * shared}, {"shared_expert_gate", false}};
  if (method == "group_limited_greedy") {
    const int64_t groups = f.integer("n_group", 0, 1, count, true), best = f.integer("topk_group", 0, 1, groups, true);
    if (count % groups) f.fail("n_group", detail::concat("must divide n_routed_experts (", count, ")"));
    if (best * (count / groups) < k) f.fail("topk_group", detail::concat("leaves fewer experts than num_experts_per_tok (", k, ") to choose from"));
    x.args["expert_groups"] = groups;
    x.args["groups_per_token"] = best;
  }
  const int64_t dense = f.integer("first_k_dense_replace", 0, 0, big);
  x.layers.assign(static_cast<size_t>(n), false);
  for (int64_t i = dense; i < n; ++i) x.layers[static_cast<size_t>(i)] = true;
  return x;
}

// Llama 4's: the layers moe_layers names, by default every interleave_moe_layer_step-th; each
// token's top num_experts_per_tok of num_local_experts by the router's logits, their sigmoids
// scaling the experts' inputs; a shared expert of intermediate_size without a gate.
// (Llama4ForCausalLM adds no auxiliary loss, so output_router_logits changes nothing; its router
// takes no jitter.)
Experts llama4_experts(const Fields& f, int64_t n) {
  Experts x;
  const int64_t count = f.integer("num_local_experts", 16, 1, 1 << 16), k = f.integer("num_experts_per_tok", 1, 1, count);
  const int64_t width = f.integer("intermediate_size", 8192, 1, int64_t{1} << 30);
  x.args = {{"experts", count}, {"experts_per_token", k}, {"router", "sigmoid_top"}, {"router_scales_input", true},
            {"d_ff", width}, {"shared_expert", width}, {"shared_expert_gate", false}};
  x.layers.assign(static_cast<size_t>(n), false);
  if (f.has("moe_layers")) {
    const json& list = f.at("moe_layers");
    if (!list.is_array()) f.fail("moe_layers", "must be a list of layer indices");
    for (const json& i : list) {
      if (!i.is_number_integer() || i.get<int64_t>() < 0 || i.get<int64_t>() >= n)
        f.fail("moe_layers", detail::concat("holds ", i.dump(), ", not a layer in [0, ", n, ")"));
      x.layers[i.get<size_t>()] = true;
    }
    return x;
  }
  const int64_t step = f.integer("interleave_moe_layer_step", 1, 1, 4096);
  for (int64_t i = step - 1; i < n; i += step) x.layers[static_cast<size_t>(i)] = true;
  return x;
}

}  // namespace

Experts read_experts(const std::string& arch, const Fields& f, int64_t n) {
  Experts x;
  x.layers.assign(static_cast<size_t>(n), false);
  const bool granite = granite_moe(arch);
  if (arch == kLlama4) return llama4_experts(f, n);
  if (arch == kGraniteMoeHybrid && f.integer("num_local_experts", 8, 0, 1 << 16) == 0) return x;  // its shared MLP alone: dense
  if (arch == kMiniMaxM2) {  // every layer: num_local_experts of intermediate_size chosen by sigmoid scores plus the correction bias, renormalized
    const int64_t count = f.integer("num_local_experts", 256, 1, 1 << 16), k = f.integer("num_experts_per_tok", 8, 1, count);
    refuse_router_logits(f);
    if (f.number("router_jitter_noise", 0.0) != 0.0) f.fail("router_jitter_noise", "above 0 is not supported (set it to 0.0)");
    x.args = {{"experts", count}, {"experts_per_token", k}, {"router", "sigmoid"}, {"router_bias", true}};
    x.layers.assign(static_cast<size_t>(n), true);
    return x;
  }
  if (arch == kDeepseekV3 || arch == kGlm4Moe) return sigmoid_experts(arch, f, n);
  if (arch == kDeepseekV2) return deepseek_v2_experts(f, n);
  if (arch == kGptOss) {  // every layer: num_local_experts of intermediate_size, the top k's softmax, biases
    const int64_t count = f.integer("num_local_experts", 128, 1, 1 << 16), k = f.integer("num_experts_per_tok", 4, 1, count);
    refuse_router_logits(f);
    x.args = {{"experts", count}, {"experts_per_token", k}, {"router", "softmax_top"}, {"router_logit_bias", true}};
    x.layers.assign(static_cast<size_t>(n), true);
    return x;
  }
  if (arch != kMixtral && arch != kQwen2Moe && arch != kQwen3Moe && arch != kQwen3Next && arch != kQwen35Moe && arch != kOlmoe && !granite) return x;
  // Qwen3-Next's and Qwen3.5-MoE's: Qwen2-MoE's gated shared expert, their own defaults.
  const bool q35 = arch == kQwen35Moe, next = arch == kQwen3Next || q35;
  const bool mixtral = arch == kMixtral, olmoe = arch == kOlmoe, qwen2 = arch == kQwen2Moe || next;
  // Qwen3-MoE's num_experts, which transformers' config writes back as num_local_experts.
  const std::string count_key = mixtral || granite || f.has("num_local_experts") ? "num_local_experts" : "num_experts";
  const int64_t count = f.integer(count_key, mixtral || granite ? 8 : olmoe ? 64 : q35 ? 256 : next ? 512 : qwen2 ? 60 : 128, 1, 1 << 16);
  const int64_t k = f.integer("num_experts_per_tok", mixtral || granite ? 2 : q35 ? 8 : next ? 10 : qwen2 ? 4 : 8, 1, count);
  refuse_router_logits(f);
  if (f.number("router_jitter_noise", 0.0) != 0.0) f.fail("router_jitter_noise", "above 0 is not supported (set it to 0.0)");
  // GraniteMoE takes the softmax over the chosen experts' scores alone: the same weights as the
  // softmax over all of them renormalized over the chosen (their order is the scores' order).
  x.args = {{"experts", count}, {"experts_per_token", k},
            {"normalize_experts", mixtral || granite || q35 || f.boolean("norm_topk_prob", next)}, {"router_cast", !mixtral}};
  if (!mixtral && !olmoe && !granite) x.args["d_ff"] = f.integer("moe_intermediate_size", next ? 512 : qwen2 ? 1408 : 768, 1, int64_t{1} << 30);  // OLMoE's: intermediate_size
  if (qwen2) x.args["shared_expert"] = f.integer("shared_expert_intermediate_size", next ? 512 : 5632, 1, int64_t{1} << 30);
  // GraniteMoeShared's shared MLP (none where shared_intermediate_size is 0), added without a gate.
  const int64_t shared = arch == kGraniteMoeShared ? f.integer("shared_intermediate_size", 0, 0, int64_t{1} << 30)
                         : arch == kGraniteMoeHybrid ? f.integer("shared_intermediate_size", 1024, 1, int64_t{1} << 30)
                                                     : 0;
  if (shared > 0) {
    x.args["shared_expert"] = shared;
    x.args["shared_expert_gate"] = false;
  }
  std::vector<bool> dense(static_cast<size_t>(n), false);
  if (((qwen2 && !q35) || arch == kQwen3Moe) && f.has("mlp_only_layers")) {
    const json& only = f.at("mlp_only_layers");
    if (!only.is_array()) f.fail("mlp_only_layers", "must be a list of layer indices");
    for (const json& i : only) {
      if (!i.is_number_integer() || i.get<int64_t>() < 0 || i.get<int64_t>() >= n) f.fail("mlp_only_layers", detail::concat("holds ", i.dump(), ", not a layer in [0, ", n, ")"));
      dense[i.get<size_t>()] = true;
    }
  }
  const int64_t step = mixtral || olmoe || granite || q35 ? 1 : f.integer("decoder_sparse_step", 1, 1, 4096);
  for (int64_t i = 0; i < n; ++i) x.layers[static_cast<size_t>(i)] = !dense[static_cast<size_t>(i)] && (i + 1) % step == 0;
  return x;
}

// An expert layer's MLP tensors: the router, each expert's (Mixtral's w1, w3, w2: gate, up, down;
// GraniteMoE's stacks: each expert's gate and up in input_linear, its down in output_linear, of
// d_ff rows or columns) and Qwen2-MoE's shared expert and its gate (GraniteMoeShared's shared_mlp,
// gate and up fused in input_linear, without a gate).
void expert_tensors(const std::string& arch, const Experts& x, int64_t d_ff, const std::string& ours, const std::string& theirs,
                    HfSpec& spec) {
  if (arch == kLlama4) {  // feed_forward.router; the experts stacked and transposed, gate's columns then up's; the shared expert
    const std::string moe = theirs + "feed_forward.";
    const int64_t width = x.args["d_ff"].get<int64_t>();
    spec.tensors.push_back({ours + "mlp.gate.weight", moe + "router.weight"});
    for (int64_t e = 0; e < x.args["experts"].get<int64_t>(); ++e) {
      const std::string expert = detail::concat(ours, "mlp.experts.", e, ".");
      spec.tensors.push_back({expert + "gate_proj.weight", moe + "experts.gate_up_proj", true, 0, width, e});
      spec.tensors.push_back({expert + "up_proj.weight", moe + "experts.gate_up_proj", true, width, width, e});
      spec.tensors.push_back({expert + "down_proj.weight", moe + "experts.down_proj", true, 0, 0, e});
    }
    for (const char* p : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"})
      spec.tensors.push_back({ours + "mlp.shared_expert." + p, moe + "shared_expert." + p});
    return;
  }
  if (arch == kGptOss) {  // mlp.router; the experts stacked, transposed, each one's gate and up columns interleaved
    const std::string moe = theirs + "mlp.";
    spec.tensors.push_back({ours + "mlp.gate.weight", moe + "router.weight"});
    spec.tensors.push_back({ours + "mlp.gate.bias", moe + "router.bias"});
    for (int64_t e = 0; e < x.args["experts"].get<int64_t>(); ++e) {
      const std::string expert = detail::concat(ours, "mlp.experts.", e, ".");
      for (const auto& [part, offset] : std::vector<std::pair<std::string, int64_t>>{{"gate_proj", 0}, {"up_proj", 1}}) {
        spec.tensors.push_back({expert + part + ".weight", moe + "experts.gate_up_proj", true, offset, d_ff, e, 2});
        spec.tensors.push_back({expert + part + ".bias", moe + "experts.gate_up_proj_bias", false, offset, d_ff, e, 2});
      }
      spec.tensors.push_back({expert + "down_proj.weight", moe + "experts.down_proj", true, 0, 0, e});
      spec.tensors.push_back({expert + "down_proj.bias", moe + "experts.down_proj_bias", false, 0, 0, e});
    }
    return;
  }
  if (granite_moe(arch)) {
    const std::string moe = theirs + "block_sparse_moe.";
    spec.tensors.push_back({ours + "mlp.gate.weight", moe + "router.layer.weight"});
    for (int64_t e = 0; e < x.args["experts"].get<int64_t>(); ++e) {
      const std::string expert = detail::concat(ours, "mlp.experts.", e, ".");
      spec.tensors.push_back({expert + "gate_proj.weight", moe + "input_linear.weight", false, 0, d_ff, e});
      spec.tensors.push_back({expert + "up_proj.weight", moe + "input_linear.weight", false, d_ff, d_ff, e});
      spec.tensors.push_back({expert + "down_proj.weight", moe + "output_linear.weight", false, 0, 0, e});
    }
    if (!x.args.contains("shared_expert")) return;
    const int64_t s = x.args["shared_expert"].get<int64_t>();
    const std::string shared = theirs + "shared_mlp.";
    spec.tensors.push_back({ours + "mlp.shared_expert.gate_proj.weight", shared + "input_linear.weight", false, 0, s});
    spec.tensors.push_back({ours + "mlp.shared_expert.up_proj.weight", shared + "input_linear.weight", false, s, s});
    spec.tensors.push_back({ours + "mlp.shared_expert.down_proj.weight", shared + "output_linear.weight"});
    return;
  }
  const bool mixtral = arch == kMixtral || arch == kMiniMaxM2;  // MiniMax-M2's under Mixtral's names, its bias beside the router
  const std::string moe = theirs + (mixtral ? "block_sparse_moe." : "mlp.");
  spec.tensors.push_back({ours + "mlp.gate.weight", moe + "gate.weight"});
  const bool sigmoid = arch == kDeepseekV3 || arch == kGlm4Moe;
  if (sigmoid) spec.tensors.push_back({ours + "mlp.gate.e_score_correction_bias", moe + "gate.e_score_correction_bias"});
  if (arch == kMiniMaxM2) spec.tensors.push_back({ours + "mlp.gate.e_score_correction_bias", moe + "e_score_correction_bias"});
  for (int64_t e = 0; e < x.args["experts"].get<int64_t>(); ++e)
    for (const auto& [mine, mixtrals] : std::vector<std::pair<std::string, std::string>>{{"gate_proj", "w1"}, {"up_proj", "w3"}, {"down_proj", "w2"}})
      spec.tensors.push_back({detail::concat(ours, "mlp.experts.", e, ".", mine, ".weight"),
                              detail::concat(moe, "experts.", e, ".", mixtral ? mixtrals : mine, ".weight")});
  if (!x.args.contains("shared_expert")) return;
  if (sigmoid || arch == kDeepseekV2) {  // their shared_experts
    for (const char* p : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"})
      spec.tensors.push_back({ours + "mlp.shared_expert." + p, moe + "shared_experts." + p});
    return;
  }
  for (const char* p : {"shared_expert.gate_proj.weight", "shared_expert.up_proj.weight", "shared_expert.down_proj.weight",
                        "shared_expert_gate.weight"})
    spec.tensors.push_back({ours + "mlp." + p, moe + p});
}

void granite_dense_mlp_tensors(int64_t d_ff, const std::string& ours, const std::string& theirs, HfSpec& spec) {
  const std::string shared = theirs + "shared_mlp.";
  spec.tensors.push_back({ours + "mlp.gate_proj.weight", shared + "input_linear.weight", false, 0, d_ff});
  spec.tensors.push_back({ours + "mlp.up_proj.weight", shared + "input_linear.weight", false, d_ff, d_ff});
  spec.tensors.push_back({ours + "mlp.down_proj.weight", shared + "output_linear.weight"});
}

}  // namespace pipetrain::models::hf_detail
