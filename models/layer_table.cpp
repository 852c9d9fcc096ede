// The layer table's rows, the argument check read from them and the docs' table written from them.
#include "models/layer_table.h"

#include <algorithm>

#include "common/error.h"
#include "common/strings.h"
#include "models/layer_rows.h"

namespace pipetrain::models {

namespace {

using K = ArgKind;

std::vector<LayerType> make_table() {
  const std::string spatial = "[C, L] or [C, H, W] → [out, ...]";
  const std::vector<LayerArg> conv{{"in_channels", K::Int, ""}, {"out_channels", K::Int, ""}, {"kernel_size", K::Int, ""},
                                   {"stride", K::Int, "1"},     {"padding", K::Int, "0"},      {"groups", K::Int, "1"},
                                   {"bias", K::Bool, "true"}};
  const std::vector<LayerArg> pool{{"kernel_size", K::Int, ""}, {"stride", K::Int, "= kernel_size"}, {"padding", K::Int, "0"}};
  const std::vector<LayerArg> bn{{"num_features", K::Int, ""}, {"momentum", K::Number, "0.1"}, {"eps", K::Number, "1e-5"}};
  const std::string bn_help = "the deferred BatchNorm of the built-in families (statistics committed once per step)";
  const std::string same = "unchanged";
  std::vector<LayerType> t{
      {"linear", {{"in_features", K::Int, ""}, {"out_features", K::Int, ""}, {"bias", K::Bool, "true"}},
       "[..., in] → [..., out]", "x·weightᵀ + bias over the last dimension", rows::linear},
      {"conv1d", conv, "[C, L] → [out, L']", "a 1-d convolution", rows::conv},
      {"conv2d", conv, "[C, H, W] → [out, H', W']", "a 2-d convolution", rows::conv},
      {"maxpool1d", pool, "[C, L] → [C, L']", "max over windows", rows::pool},
      {"maxpool2d", pool, "[C, H, W] → [C, H', W']", "max over windows", rows::pool},
      {"avgpool1d", pool, "[C, L] → [C, L']", "mean over windows", rows::pool},
      {"avgpool2d", pool, "[C, H, W] → [C, H', W']", "mean over windows", rows::pool},
      {"adaptiveavgpool1d", {{"output_size", K::Int, ""}}, "[C, L] → [C, output_size]", "mean over `output_size` even windows",
       rows::adaptive_pool},
      {"adaptiveavgpool2d", {{"output_size", K::Int, ""}}, "[C, H, W] → [C, output_size, output_size]",
       "mean over `output_size`² even windows", rows::adaptive_pool},
      {"upsample", {{"scale_factor", K::Int, "2"}}, "[C, H, W] → [C, H·s, W·s]", "nearest-neighbour upsampling", rows::upsample},
      {"batchnorm1d", bn, "[F] or [C, L] → unchanged", bn_help, rows::batchnorm},
      {"batchnorm2d", bn, "[C, H, W] → unchanged", bn_help, rows::batchnorm},
      {"layernorm", {{"normalized_shape", K::IntOrList, ""}, {"eps", K::Number, "1e-5"}}, same,
       "layer normalization over the trailing dimensions `normalized_shape`", rows::norm},
      {"rmsnorm", {{"normalized_shape", K::IntOrList, ""}, {"eps", K::Number, "1e-6"}, {"scale", K::String, "\"after_cast\""}, {"center", K::Bool, "false"}, {"bias", K::Bool, "false"}}, same,
       "RMS normalization with a learned scale (torch.nn.RMSNorm); `scale`: where it applies in a lower precision, "
       "after the cast back (Llama's), `before_cast` (OLMo 2's) or `one_plus` (Gemma's 1 + weight, the weight zeros at the start); "
       "`center`: the mean subtracted first, a LayerNorm without a bias (Cohere's); with `bias` too, torch's LayerNorm, "
       "a weight and a bias (`rms.bias`; StarCoder2's); `scale` `none` with `center`: no weight, torch's LayerNorm without "
       "parameters, in float32 for lower precisions (OLMo's)",
       rows::norm},
      {"dropout", {{"p", K::Number, "0.5"}}, same,
       "keyed masks: the same whatever the stage count or micro-batching, and in a recomputation", rows::dropout},
      {"embedding",
       {{"num_embeddings", K::Int, ""}, {"embedding_dim", K::Int, ""}, {"max_positions", K::Int, "0: no positions"},
        {"dropout", K::Number, "0, with positions"}, {"padding_idx", K::Int, "none"}, {"scale", K::Number, "1"}},
       "[T] token ids → [T, embedding_dim]",
       "token embedding (`input_dtype` `\"long\"`); with `max_positions`, a learned position embedding is added; "
       "`padding_idx` (without positions): that token's row takes no gradient, as torch.nn.Embedding's; `scale` (without "
       "positions): the output multiplied by it, a float32 value in the weights' type (Gemma's sqrt(d_model))",
       rows::embedding},
      {"transformer_block",
       {{"d_model", K::Int, ""}, {"n_heads", K::Int, ""}, {"d_ff", K::Int, "4·d_model"}, {"dropout", K::Number, "0"},
        {"causal", K::Bool, "true"}},
       "[T, d] → [T, d]", "pre-norm self-attention and GELU MLP", rows::transformer_block},
      {"llama_block",
       {{"d_model", K::Int, ""}, {"n_heads", K::Int, ""}, {"n_kv_heads", K::Int, "n_heads"}, {"head_dim", K::Int, "d_model / n_heads"},
        {"d_ff", K::Int, ""}, {"eps", K::Number, "1e-6"}, {"rope_theta", K::Number, "10000"},
        {"partial_rotary_factor", K::Number, "1: the whole head rotated"},
        {"rope_scaling", K::Object, "none; `{\"rope_type\": \"linear\", \"llama3\", \"yarn\", \"longrope\" or \"dynamic\", \"factor\", …}` as transformers writes it"}, {"qkv_bias", K::Bool, "false"},
        {"o_bias", K::Bool, "false"}, {"mlp_bias", K::Bool, "false"}, {"qk_norm", K::Bool, "false"},
        {"qk_norm_over", K::String, "\"head\""}, {"sliding_window", K::Int, "0: none"}, {"norms", K::String, "\"pre\""},
        {"norm_scale", K::String, "\"after_cast\""}, {"norm_center", K::Bool, "false"}, {"norm_bias", K::Bool, "false"}, {"act", K::String, "\"silu\""}, {"attn_scale", K::Number, "1/sqrt(head_dim)"},
        {"attn_softcap", K::Number, "0: none"}, {"experts", K::Int, "0: one MLP"}, {"experts_per_token", K::Int, "2"},
        {"normalize_experts", K::Bool, "true"}, {"router_cast", K::Bool, "false"}, {"experts_sum_float32", K::Bool, "false"}, {"experts_latent", K::Int, "0"}, {"rope_float32", K::Bool, "false"}, {"rope_tables_rounded", K::Bool, "false"},
        {"clip_qkv", K::Number, "0: none"}, {"shared_expert", K::Int, "0: none"}, {"shared_expert_gate", K::Bool, "true"},
        {"swiglu_alpha", K::Number, "1.702"}, {"swiglu_limit", K::Number, "7"}, {"attn_sinks", K::Bool, "false"},
        {"router", K::String, "\"softmax\""}, {"router_logit_bias", K::Bool, "false"}, {"router_bias", K::Bool, "false"}, {"expert_groups", K::Int, "1"},
        {"groups_per_token", K::Int, "expert_groups"}, {"routed_scale", K::Number, "1"}, {"router_float32", K::Bool, "false"},
        {"kv_lora_rank", K::Int, "0: grouped-query attention"}, {"q_lora_rank", K::Int, "0: q_proj"}, {"rope_head_dim", K::Int, ""},
        {"v_head_dim", K::Int, "head_dim"}, {"rope_interleave", K::Bool, "false"}, {"rope_pairs_kept", K::Bool, "false"},
        {"latent_eps", K::Number, "1e-6"},
        {"residual_scale", K::Number, "1"}, {"rotary", K::Bool, "true"}, {"q_scale_beta", K::Number, "0: none"},
        {"q_scale_length", K::Int, ""}, {"attention_chunk", K::Int, "0: none"}, {"qk_l2_norm", K::Bool, "false"},
        {"q_temperature", K::Number, "0: none"}, {"q_temperature_floor", K::Int, "8192"}, {"router_scales_input", K::Bool, "false"},
        {"experts_kernel", K::String, "\"loop\""}, {"mlp_gate", K::Bool, "true"},
        {"qk_norm_after_rope", K::Bool, "false"}, {"attn_output_gate", K::Bool, "false"},
        {"linear_key_heads", K::Int, "0: attention"}, {"linear_value_heads", K::Int, "linear_key_heads"},
        {"linear_key_head_dim", K::Int, ""}, {"linear_value_head_dim", K::Int, ""}, {"linear_conv_kernel", K::Int, "4"},
        {"linear_projections", K::String, "\"fused\""}, {"mamba_heads", K::Int, "0: attention"}, {"mamba_head_dim", K::Int, ""},
        {"mamba_state", K::Int, ""}, {"mamba_groups", K::Int, "1"}, {"mamba_conv_kernel", K::Int, "4"}, {"mamba_chunk", K::Int, "256"},
        {"mamba_conv_bias", K::Bool, "true"}, {"mamba_proj_bias", K::Bool, "false"}, {"mamba_dt_min", K::Number, "0"},
        {"mamba_dt_max", K::Number, "none"}, {"mixer", K::Bool, "true"}, {"mlp", K::Bool, "true"},
        {"dropout", K::Number, "0"}, {"attn_dropout", K::Number, "dropout"}, {"parallel_sum", K::String, "\"residual_first\""},
        {"qk_norm_bias", K::Bool, "false"}, {"kv_heads", K::String, "\"grouped\""},
        {"bias_apart", K::Bool, "false"}, {"lora_rank", K::Int, "0: none"}, {"lora_alpha", K::Number, "8"},
        {"lora_dropout", K::Number, "0"}, {"lora_rslora", K::Bool, "false"}, {"lora_targets", K::Names, "[\"q_proj\", \"v_proj\"]"}},
       "[T, d] → [T, d]",
       "a Llama-family decoder layer as transformers computes it (RMSNorm, rotary positions, grouped-query causal attention, "
       "SwiGLU; with `qk_norm`, Qwen3's RMSNorm of each head's queries and keys, or OLMo 2's of the whole projection with "
       "`qk_norm_over` `\"projection\"`, or Command R+'s of each head with its own weight (`q_norm.weight` [n_heads, head_dim]) with `qk_norm_over` `\"each_head\"`; `norms` `\"post\"`: OLMo 2's norms on attention's and the MLP's outputs, "
       "`\"sandwich\"`: Gemma 2's before and after each, `\"parallel\"`: Cohere's one norm feeding attention and the MLP side by side, x + attn(n(x)) + mlp(n(x)), `\"parallel_two\"`: GPT-NeoX's, each through its own, x + attn(`input_layernorm`(x)) + mlp(`post_attention_layernorm`(x)), summed (x + attn) + mlp or with `parallel_sum` `\"branches_first\"` (attn + mlp) + x (GPT-NeoX's, Phi's); `norm_scale` as rmsnorm's `scale`, `norm_center` as its `center` (the layer's norms, q's and k's too), `norm_bias` as its `bias`, `qk_norm_bias` as the q/k norms' (Phi's LayerNorm of each head, one weight and bias for all); `act` `\"gelu_tanh\"`: GeGLU (without a gate: the tanh GELU), `\"gelu\"`: torch's exact GELU, `\"gelu_new\"`, `\"gelu_fast\"`: transformers' approximations op by op, `\"swiglu_oai\"`: GPT-OSS's clamped SwiGLU, (clamp(up, ±`swiglu_limit`) + 1)·g·sigmoid(`swiglu_alpha`·g), g = min(gate, `swiglu_limit`); `attn_sinks`: GPT-OSS's learned logit per head (`self_attn.sinks`) in each softmax's denominator; "
       "`attn_softcap`: Gemma 2's cap·tanh(scores/cap); `kv_heads`: how grouped key and value heads reach torch's fused attention where no mask is needed, `\"grouped\"` its grouped-query path, `\"repeated\"` each repeated for its queries first (Falcon-40B's), `\"broadcast\"` one head broadcast over the queries' (Falcon-7B's, n_kv_heads 1): the same math, each kernel's own roundings; `bias_apart`: each projection's product rounded before its bias is added, not in one op (Falcon's `x @ W.T + b`; attention and one MLP, no experts, latents or other mixer); `experts` above 0: a sparse mixture of that many SwiGLU experts of `d_ff` "
       "in the MLP's place, each token's top `experts_per_token` by the router's softmax, as Mixtral's and Qwen3-MoE's, "
       "`mlp.gate.weight`, `mlp.experts.0.gate_proj.weight`, …; `shared_expert` above 0: Qwen2-MoE's shared SwiGLU expert of that width for every token, scaled by sigmoid(`mlp.shared_expert_gate`), or added as is with `shared_expert_gate` false (GraniteMoeShared's); `rope_float32`: OLMo 2's rotation in float32 in lower precisions, with `rope_tables_rounded` its tables rounded to the type first (Cohere's); `clip_qkv`: OLMoE's clamp of q, k and v; `residual_scale`: Granite's multiplier of each branch before its residual add; `rotary` false: no rotary positions, SmolLM3's NoPE layers; `q_scale_beta`: Ministral 3's queries times 1 + beta·log(1 + floor(position / `q_scale_length`)) after the rotation; `router` `\"softmax_top\"`: GPT-OSS's, the softmax of the chosen experts' logits alone, in their type; `router_logit_bias`: a trained bias on the router's logits (`mlp.gate.bias`); `router` `\"sigmoid\"`: DeepSeek-V3's routing, sigmoid scores, chosen with `mlp.gate.e_score_correction_bias` (a buffer, with `router_bias`) added within the `groups_per_token` of `expert_groups` groups whose two best sum highest, renormalized over the chosen (plus 1e-20) with `normalize_experts`; `routed_scale`: the chosen weights' multiplier; `router_float32`: the router's scores computed in float32 in lower precisions; `experts_sum_float32`: the routed experts' outputs summed in float32 in lower precisions, then cast (Nemotron-H's); `experts_latent` above 0: the routed experts on a latent of that size, `mlp.fc1_latent_proj` into it and `mlp.fc2_latent_proj` out (Nemotron-H's latent experts; the router and the shared expert on the hidden state); `kv_lora_rank` above 0: DeepSeek's multi-head latent attention, a latent of that rank expanded to each head's keys and values, a shared rotated key of `rope_head_dim` at the end of each head of `head_dim`, values of `v_head_dim`, queries through a latent of `q_lora_rank` (0: directly), `self_attn.kv_a_proj_with_mqa.weight`, `self_attn.kv_b_proj.weight`, …; `rope_interleave`: the rotated values as interleaved pairs, put back in their places with `rope_pairs_kept` (DeepSeek-V2's, and Llama 4's, GLM-4's and Ernie 4.5's without latents, of the first int(head_dim·`partial_rotary_factor`) values there); `expert_groups` with the softmax router: DeepSeek-V2's choice within the `groups_per_token` groups of highest best score; `attention_chunk`: Llama 4's chunked attention, a query sees only the keys of its chunk of that many positions; `qk_l2_norm`: Llama 4's RMS norm of each head's queries and keys without a weight, after the rotation; `q_temperature`: Llama 4's NoPE layers' queries times 1 + `q_temperature`·log(1 + floor((position + 1) / `q_temperature_floor`)); `router` `\"sigmoid_top\"`: Llama 4's, the sigmoid of the chosen experts' logits; `router_scales_input`: a chosen expert's weight scales its input, not its output (Llama 4's); `experts_kernel` `\"grouped\"`: the experts' products as grouped GEMMs (torch's `_grouped_mm`, transformers' `grouped_mm` experts) with no host read, where torch's kernel takes the type (float32, bfloat16, float16) and rows of a multiple of 16 bytes, the loop otherwise; `act` `\"relu2\"`: relu(x)² in SiLU's place, `\"xielu\"` (without a gate): Apertus's xIELU with its two trained scalars `mlp.act_fn.alpha_p` and `alpha_n`; `mlp_gate` false: an MLP without a gate, down(act(up(x))), Arcee's, `mlp.up_proj.weight` and `mlp.down_proj.weight` alone; `qk_norm_after_rope`: the per-head q/k norms on the rotated queries and keys, Hunyuan's; `attn_output_gate`: Qwen3-Next's gated attention, `self_attn.q_proj` giving each head's queries then a gate whose sigmoid scales the head's output; `linear_key_heads` above 0: Qwen3-Next's gated DeltaNet in attention's place, `linear_key_heads` query and key heads of `linear_key_head_dim` and `linear_value_heads` value heads of `linear_value_head_dim` through a causal depthwise convolution of `linear_conv_kernel` positions and the gated delta rule by chunks of 64, an RMSNorm times silu of the output gate, `linear_attn.in_proj_qkvz.weight`, `linear_attn.in_proj_ba.weight`, `linear_attn.conv1d.weight`, `linear_attn.dt_bias`, `linear_attn.A_log`, `linear_attn.norm.weight`, `linear_attn.out_proj.weight`, or with `linear_projections` `\"split\"` Qwen3.5's `linear_attn.in_proj_qkv.weight` (every query, key, value), `in_proj_z`, `in_proj_b`, `in_proj_a` in place of the first two; in generation it keeps its convolution's last inputs and the rule's state); `mamba_heads` above 0: Mamba 2's mixer in attention's place (Granite 4.0-H's), `mamba_heads` heads of `mamba_head_dim` with a state of `mamba_state` per head, B and C shared by the heads of each of `mamba_groups` groups, a causal depthwise convolution of `mamba_conv_kernel` positions (its bias with `mamba_conv_bias`), the steps softplus(dt + `mamba.dt_bias`) clamped to [`mamba_dt_min`, `mamba_dt_max`], the scan by chunks of `mamba_chunk`, its output times silu of the gate, RMS-normalized by groups, `mamba.in_proj.weight`, `mamba.conv1d.weight`, `mamba.conv1d.bias`, `mamba.dt_bias`, `mamba.A_log`, `mamba.D`, `mamba.norm.weight`, `mamba.out_proj.weight` (and the projections' biases with `mamba_proj_bias`); in generation it keeps its convolution's last inputs and the scan's state; `mixer` false: a block of its MLP alone, x + mlp(`post_attention_layernorm`(x)), `mlp` false: of its mixer alone, x + mixer(`input_layernorm`(x)) (Nemotron-H's blocks); experts without a gate (`mlp_gate` false with `act` `\"relu2\"`: Nemotron-H's); `dropout`, `attn_dropout` (training alone, keyed masks as the `dropout` layer's): of attention's and the MLP's outputs before each residual add, and of the attention weights, StarCoder2's, Seed-OSS's, GPT-NeoX's and Phi's (a block with `norms` `\"pre\"` or parallel and plain attention); `lora_rank` above 0: LoRA's adapters beside the projections `lora_targets` names (or `\"all\"` of them the block has: attention's of its own, the MLP's where it has no experts), each adding `lora_alpha`/`lora_rank` (/sqrt(`lora_rank`) with `lora_rslora`)·B(A(x)) with A [rank, in] and B [out, rank], `self_attn.q_proj.lora_A.weight`, `…lora_B.weight` as PEFT names them (`lora_targets` `\"all-linear\"`: PEFT's spelling of `\"all\"`), A starting as torch's Linear's and B at zero, `lora_dropout` keyed masks of the adapters' inputs; parameters `self_attn.q_proj.weight`, `mlp.gate_proj.weight`, …",
       rows::llama_block},
      {"gpt2_block",
       {{"d_model", K::Int, ""}, {"n_heads", K::Int, ""}, {"d_ff", K::Int, "4·d_model"}, {"eps", K::Number, "1e-5"},
        {"dropout", K::Number, "0"}, {"attn_dropout", K::Number, "= dropout"}, {"act", K::String, "\"gelu_tanh\""}},
       "[T, d] → [T, d]",
       "GPT-2's block in transformers' layout (`ln_1`, `attn.c_attn`, `attn.c_proj`, `ln_2`, `mlp.c_fc`, `mlp.c_proj`; tanh GELU, "
       "or with `act` `\"gelu_new\"` transformers' gelu_new op by op)",
       rows::gpt2_block},
      {"mlp_block", {{"d_model", K::Int, ""}, {"d_ff", K::Int, "4·d_model"}, {"dropout", K::Number, "0"}}, same,
       "x + dropout(fc2(gelu(fc1(layernorm(x)))))", rows::mlp_block},
  };
  for (const char* f : {"relu", "gelu", "silu", "tanh", "sigmoid", "identity"})
    t.push_back({f, {}, same, std::string("the element-wise ") + f, rows::activation});
  const std::vector<LayerType> rest{
      {"softcap", {{"cap", K::Number, ""}}, same, "cap·tanh(x/cap) element-wise (Gemma 2's final logits)", rows::softcap},
      {"scale", {{"by", K::Number, ""}, {"op", K::String, "\"multiply\""}}, same,
       "x·by, or x/by with `op` `\"divide\"`, `by` taken as Python's `x * 0.5` takes a number, not rounded to the tensor's type first (Granite's embedding multiplier and logits scaling)",
       rows::scale},
      {"softmax", {{"dim", K::Int, "−1"}}, same, "softmax along `dim` (counting the batch as 0)", rows::softmax},
      {"flatten", {{"start_dim", K::Int, "1"}}, "[C, H, W] → [C·H·W]", "the dimensions from `start_dim` (counting the batch as 0) as one",
       rows::flatten},
      {"reshape", {{"shape", K::List, ""}}, "e.g. [784] → [1, 28, 28]", "one sample's new shape (one −1 allowed)", rows::reshape},
      {"permute", {{"dims", K::List, ""}}, "e.g. `[0, 2, 1]`: [C, T] → [T, C]", "PyTorch's dims, the batch's 0 first", rows::permute},
      {"transpose", {{"dim0", K::Int, "1"}, {"dim1", K::Int, "2"}}, "the two dimensions swapped",
       "dims counting the batch as 0", rows::transpose},
      {"mean", {{"dim", K::Int, "−1"}, {"keepdim", K::Bool, "false"}}, "the dimension removed (or 1)",
       "the mean over one dimension (a ViT's or Mixer's pooling)", rows::mean},
      {"add", {{"from", K::String, ""}}, same, "merges a skip: adds what a layer before stashed under `from`", nullptr},
      {"concat", {{"from", K::String, ""}, {"dim", K::Int, "1"}}, "`dim` grows by the skip's",
       "merges a skip: concatenates what a layer before stashed under `from` along `dim`", nullptr},
      {"repeat", {{"count", K::Int, ""}, {"layers", K::Layers, ""}}, "as its layers",
       "the block `count` times, names numbered: `block` → `block_0`, `block_1`, …", nullptr},
      {"sequential", {{"layers", K::Layers, ""}}, "as its layers",
       "its layers as one layer of the list (one partition unit); each one's parameters under its `module`", nullptr},
  };
  t.insert(t.end(), rest.begin(), rest.end());
  return t;
}

const char* kind_text(ArgKind k) {
  switch (k) {
    case K::Int: return "an integer";
    case K::Number: return "a number";
    case K::Bool: return "true or false";
    case K::String: return "a string";
    case K::IntOrList: return "an integer or a list of integers";
    case K::List: return "a list of numbers";
    case K::Layers: return "a list of layers";
    case K::Object: return "an object";
    case K::Names: return "a string or a list of strings";
  }
  return "";
}

bool kind_holds(ArgKind k, const nlohmann::json& v) {
  switch (k) {
    case K::Int:
    case K::Number: return v.is_number();
    case K::Bool: return v.is_boolean();
    case K::String: return v.is_string();
    case K::IntOrList: return v.is_number() || v.is_array();
    case K::List:
    case K::Layers: return v.is_array();
    case K::Object: return v.is_object();
    case K::Names: return v.is_string() || v.is_array();
  }
  return false;
}

std::string args_text(const std::vector<LayerArg>& args) {
  if (args.empty()) return "—";
  std::vector<std::string> parts;
  for (const LayerArg& a : args) parts.push_back("`" + a.name + "`" + (a.def.empty() ? "" : " (" + a.def + ")"));
  return join(parts, ", ");
}

}  // namespace

const std::vector<LayerType>& layer_table() {
  static const std::vector<LayerType> table = make_table();
  return table;
}

const LayerType* find_layer_type(const std::string& type) {
  for (const LayerType& t : layer_table())
    if (t.name == type) return &t;
  return nullptr;
}

std::vector<std::string> layer_type_names() {
  std::vector<std::string> names;
  for (const LayerType& t : layer_table()) names.push_back(t.name);
  return names;
}

const std::vector<LayerArg>& common_layer_args() {
  static const std::vector<LayerArg> common{{"name", K::String, ""},
                                            {"type", K::String, ""},
                                            {"stash", K::String, "none"},
                                            {"module", K::String, "the type's short name"}};
  return common;
}

void check_layer_args(JsonReader& r, const nlohmann::json& layer, const LayerType& type) {
  if (!layer.is_object()) return;
  for (const auto& [key, value] : layer.items()) {
    const LayerArg* arg = nullptr;
    for (const auto* list : {&common_layer_args(), &type.args})
      for (const LayerArg& a : *list)
        if (a.name == key) arg = &a;
    if (!arg) {
      std::vector<std::string> names;
      for (const LayerArg& a : type.args) names.push_back(a.name);
      r.fail(key, "is not an argument of " + type.name + " (" +
                      (names.empty() ? std::string("it takes none") : "it takes " + join(names, ", ")) +
                      "; every layer: name, type, stash, module)");
    }
    if (!value.is_null() && !kind_holds(arg->kind, value))
      r.fail(key, std::string("expected ") + kind_text(arg->kind) + " (an argument of " + type.name + "), got " + describe(value));
  }
}

std::string layer_table_markdown() {
  std::string md = "| type | arguments (default) | sample shape in → out | what it is |\n|---|---|---|---|\n";
  for (const LayerType& t : layer_table()) md += "| `" + t.name + "` | " + args_text(t.args) + " | " + t.shape + " | " + t.help + " |\n";
  return md;
}

}  // namespace pipetrain::models
