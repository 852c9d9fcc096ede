// Decoder blocks of today's language models, as Hugging Face's transformers computes them: the
// Llama family's (RMSNorm, rotary positions, grouped-query attention, SwiGLU; Mistral's sliding
// window and Qwen2's q/k/v biases as options; DeepSeek's multi-head latent attention and
// sigmoid routing; Llama 4's chunked attention, unweighted q/k norms and input-scaled experts) and GPT-2's. Their submodules carry transformers'
// names, so that a block's parameter "self_attn.q_proj.weight" is the checkpoint's
// "model.layers.<i>.self_attn.q_proj.weight" (models/hf.cpp). Attention is
// at::scaled_dot_product_attention, causal; attention dropout above 0 in training keeps the
// explicit path with keyed masks (the same masks whatever the stage count or micro-batching).
// Each block also runs incrementally, on the next positions of sequences whose earlier keys and
// values it kept (a KvCache), for generation (models/generate.h).
#pragma once

#include <limits>
#include <string>
#include <vector>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "common/json_reader.h"
#include "models/layers.h"
#include "models/lora.h"

namespace pipetrain::models {

/// Rotary position embedding as transformers computes it: the inverse frequencies of the
/// default kind, or scaled by `linear`, `llama3` (Llama 3.1's), `yarn` (Qwen's and others' long
/// contexts) or `longrope` (Phi-3's: its short factors up to `original_max_positions` positions,
/// its long ones beyond, chosen per forward by the last position as transformers chooses) or
/// `dynamic` (NTK scaling: beyond `original_max_positions` positions the default kind of a base
/// grown with the forward's last position, as transformers grows it); other kinds are refused
/// where a config is read (models/hf.cpp, decoder_options.cpp).
struct Rope {
  double theta = 10000;
  std::string type = "default";  // "default", "linear", "llama3", "yarn", "longrope" or "dynamic"
  double factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_max_positions = 8192;  // original_max_position_embeddings (llama3, yarn, longrope, dynamic)
  double beta_fast = 32, beta_slow = 1;   // yarn's ramp between its corrections' dimensions
  bool truncate = true;                   // yarn: those dimensions rounded outwards
  std::vector<double> short_factor, long_factor;  // longrope: one per rotated pair
  double attention_factor = 1;  // cos and sin are scaled by it (yarn's and longrope's)
  double partial = 1;           // rotary positions over the first int(head_dim * partial) values of a head
};

/// transformers' yarn_get_mscale: 0.1 * m * ln(factor) + 1 for a factor above 1, else 1 (yarn's
/// attention factor; DeepSeek's attention scale).
double yarn_mscale(double factor, double m = 1);
/// The values of a head the rotation turns: int(head_dim * partial), even (checked where read).
int64_t rotary_dim(const Rope& rope, int64_t head_dim);
/// Whether a forward whose last position is `end` - 1 takes longrope's long factors.
bool rope_long(const Rope& rope, int64_t end);
/// The sequence length a forward whose last position is `end` - 1 computes `dynamic`'s base for
/// (at least original_max_positions, where the base is theta); 0 for the other kinds.
int64_t rope_dynamic_length(const Rope& rope, int64_t end);
/// The inverse frequencies for a head of `head_dim` values ([rotary_dim / 2]; longrope's long
/// factors where `long_factors`): in float32 with transformers' operations for float32 and lower
/// precisions (so the angles are the ones a checkpoint was trained with), in float64 for float64.
/// `dynamic_length`: rope_dynamic_length's, for `dynamic`.
at::Tensor rope_inv_freq(const Rope& rope, int64_t head_dim, at::ScalarType type, bool long_factors = false,
                         int64_t dynamic_length = 0);
/// cos and sin, [T, rotary_dim], of positions offset..offset+T-1, in `type` (computed as
/// rope_inv_freq says, scaled by the attention factor).
std::pair<at::Tensor, at::Tensor> rope_tables(const Rope& rope, int64_t head_dim, int64_t offset, int64_t T,
                                              at::ScalarType type, const at::Device& device);
/// The same from `inv`, rope_inv_freq's result already on the tables' device.
std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& inv, int64_t offset, int64_t T, at::ScalarType type,
                                              double attention_factor = 1);
/// x [B, H, T, D] rotated: x * cos + rotate_half(x) * sin (transformers' convention: the two
/// halves of each head, not interleaved pairs); with tables narrower than a head, its first
/// values rotated and the rest passed through (partial rotary, Phi-4-mini's).
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// What one attention layer kept of the positions before: keys and values [B, KV heads, S, D]
/// (undefined before the first call).
struct KvCache {
  at::Tensor k, v;
  /// A gated DeltaNet layer's instead: the last linear_conv_kernel - 1 inputs of its convolution
  /// [B, channels, K - 1] and the delta rule's state [B, value heads, key head_dim, value head_dim];
  /// a Mamba 2 mixer's: its convolution's last inputs and the scan's state [B, heads, head_dim, state].
  at::Tensor conv, state;
  int64_t positions = 0;  ///< how many positions conv and state stand for
  /// Set by a call whose positions the kept ones no longer match: longrope's first forward past
  /// its pretraining length, which rotates every position by the long factors. Generation then
  /// runs the whole window again (as transformers' generate drops its cache there).
  bool stale = false;
  /// The oldest positions a layer no longer keeps: a windowed layer keeps the window's last
  /// positions before the next (window - 1), a chunked one those of the current chunk.
  int64_t dropped = 0;
  /// The positions the cache stands for, kept or dropped.
  int64_t length() const { return k.defined() ? dropped + k.size(2) : positions; }
};

/// How grouped key and value heads reach torch's fused attention where no mask is needed; each
/// picks a kernel of its own, whose roundings differ (as their families' transformers code calls it).
enum class KvHeads {
  Grouped,    ///< as they are, sdpa's grouped-query path (enable_gqa)
  Repeated,   ///< each repeated for its queries' heads first (Falcon-40B's broadcast keys)
  Broadcast,  ///< one key and value head broadcast over the queries' (Falcon-7B's multi-query)
};

/// Causal attention of q [B, H, Tq, D] over k, v [B, KV, Tk, D] (KV divides H: grouped query),
/// the queries being the last Tq of the Tk positions; with `window` > 0 a query sees only the
/// `window` positions up to itself (Mistral's sliding window); with `chunk` > 0 only those of its
/// own chunk of `chunk` positions (0..chunk-1, chunk..2·chunk-1, …: Llama 4's chunked attention). `dropout` (training, p > 0):
/// keyed dropout of the attention weights on the explicit path; `softcap` > 0 (Gemma 2's) too:
/// the scores through softcap * tanh(scores / softcap), the softmax in float32 at least.
/// `sinks` ([H], GPT-OSS's): each head's learned logit joins its softmax's denominator, on the
/// explicit path in the scores' type, as transformers computes it. Where a mask is needed (a
/// window, a chunk, queries after cached positions), grouped key and value heads are repeated for
/// their queries as transformers repeats them, so that the backward sums as its does. Where none
/// is, `kv_heads` says how grouped heads reach torch's fused attention (KvHeads).
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                            int64_t window, DropoutImpl* dropout, double softcap = 0, const at::Tensor& sinks = {},
                            int64_t chunk = 0, KvHeads kv_heads = KvHeads::Grouped);

/// Where a decoder layer's RMSNorms sit.
enum class NormPlacement {
  Pre,       ///< input_layernorm before attention, post_attention_layernorm before the MLP (Llama)
  Post,      ///< post_attention_layernorm on attention's output, post_feedforward_layernorm on the MLP's (OLMo 2)
  Sandwich,  ///< both: input_, post_attention_, pre_feedforward_ and post_feedforward_layernorm (Gemma 2 and 3)
  Parallel,  ///< input_layernorm alone, feeding attention and the MLP side by side: x + attn(n(x)) + mlp(n(x)) (Cohere)
  ParallelTwo,  ///< side by side, each its own: x + attn(input_layernorm(x)) + mlp(post_attention_layernorm(x)) (GPT-NeoX)
};

/// The GELU of an MLP, as transformers' activations compute it.
enum class Gelu {
  None,  ///< not a GELU (SiLU, relu², xIELU)
  Tanh,  ///< torch's tanh approximation (gelu_pytorch_tanh; Gemma's GeGLU)
  Erf,   ///< torch's exact GELU (transformers' "gelu")
  New,   ///< 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) op by op (transformers' "gelu_new")
  Fast,  ///< 0.5·x·(1 + tanh(x·0.7978845608·(1 + 0.044715·x·x))) op by op (transformers' "gelu_fast")
};

/// `x` through `g` (Gelu::None: x unchanged).
at::Tensor apply_gelu(Gelu g, const at::Tensor& x);

struct LlamaBlockOptions {
  int64_t d_model = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, d_ff = 0;
  double eps = 1e-6;
  Rope rope;
  bool qkv_bias = false;  // biases on q, k and v (Qwen2; Llama's attention_bias)
  bool o_bias = false;    // on o (Llama's attention_bias)
  bool mlp_bias = false;  // on gate, up and down (Llama's mlp_bias)
  bool qk_norm = false;   // queries and keys RMS-normalized before the rotation (Qwen3, OLMo 2, Gemma 3)
  bool qk_norm_projection = false;  // over the whole projection (OLMo 2), not each head (Qwen3)
  bool qk_norm_each_head = false;   // over each head, each with its own weight [heads, head_dim] (Command R+'s)
  int64_t sliding_window = 0;  // 0: none
  NormPlacement norms = NormPlacement::Pre;
  RmsScale norm_scale = RmsScale::AfterCast;  // every RMSNorm's (Gemma's (1 + weight))
  bool norm_center = false;  // the block's norms (q/k's too) subtract the mean first: LayerNorms without a bias (Cohere's)
  bool norm_bias = false;    // with norm_center: the block's norms torch's LayerNorms, with a bias (StarCoder2's); q/k's torch's too
  Gelu gelu = Gelu::None;    // the MLP's activation a GELU (Gemma's GeGLU: Tanh; GPT-NeoX's Erf; Phi's New), not SiLU
  bool parallel_branches_first = false;  // parallel norms: (attn + mlp) + x (GPT-NeoX's, Phi's), not (x + attn) + mlp
  bool qk_norm_bias = false;  // (with qk_norm and norm_center) the q/k norms torch's LayerNorms, with a bias (Phi's)
  bool relu2 = false;        // the MLP's activation relu(x)² (Arcee's), not SiLU
  bool mlp_gate = true;      // false: an MLP without a gate, down(act(up(x))) (Arcee's)
  bool xielu = false;        // (without a gate) the MLP's activation xIELU, with its two trained scalars (Apertus's)
  bool qk_norm_after_rope = false;  // with qk_norm over heads: the norms on the rotated queries and keys (Hunyuan's)
  double swiglu_alpha = 0;   // > 0: GPT-OSS's clamped SwiGLU, (clamp(up) + 1) * g * sigmoid(alpha * g), g = min(gate, limit)
  double swiglu_limit = 7;
  bool attn_sinks = false;   // a learned logit per head in each softmax's denominator ("self_attn.sinks", GPT-OSS's)
  double attn_scale = 0;     // the scores' scale; 0: 1 / sqrt(head_dim) (Gemma's query_pre_attn_scalar^-0.5)
  double attn_softcap = 0;   // scores through cap * tanh(scores / cap) before the mask (Gemma 2); 0: none
  KvHeads kv_heads = KvHeads::Grouped;  // how grouped heads reach the fused attention (Falcon's: repeated, broadcast)
  bool bias_apart = false;  // each projection's product rounded, then its bias added (Falcon's x @ W.T + b), not one fused op
  bool rope_float32 = false;  // lower precisions rotate q and k in float32, then cast back (OLMo 2's)
  bool rope_tables_rounded = false;  // with rope_float32: the cos and sin tables rounded to the type first (Cohere's)
  double clip_qkv = 0;        // > 0: q, k and v clamped to [-clip_qkv, clip_qkv] after the q/k norms (OLMoE's)
  double residual_scale = 1;  // attention's and the MLP's outputs times this before each residual add (Granite's)
  bool rotary = true;         // false: q and k not rotated, no positions at all (SmolLM3's NoPE layers)
  double q_scale_beta = 0;    // > 0: rotated queries times 1 + beta * log(1 + floor(position / q_scale_length)) (Ministral 3's)
  int64_t q_scale_length = 0;
  int64_t attention_chunk = 0;  // > 0: a query sees only the keys of its chunk of that many positions (Llama 4's)
  bool qk_l2_norm = false;      // q and k RMS-normalized over each head without a weight after the rotation, in float32 (Llama 4's L2 norm)
  double q_temperature = 0;     // > 0: queries times 1 + q_temperature * log1p(floor((position + 1) / q_temperature_floor)) (Llama 4's NoPE layers)
  int64_t q_temperature_floor = 8192;
  int64_t experts = 0;       // > 0: a sparse mixture of that many experts in the MLP's place (Moe)
  int64_t experts_per_token = 2;
  bool normalize_experts = true;  // the chosen experts' probabilities renormalized to sum to 1
  bool router_cast = false;       // the routing weights cast to the model's type before they scale (Qwen's)
  bool experts_sum_float32 = false;  // lower precisions sum the routed experts' outputs in float32, then cast (Nemotron-H's)
  int64_t experts_latent = 0;        // > 0: the routed experts work on a latent of this size (fc1_latent_proj in, fc2_latent_proj out)
  int64_t shared_expert = 0;      // > 0 (with experts): Qwen2-MoE's shared expert of that width beside them
  bool router_top_softmax = false;  // the softmax of the chosen experts' logits alone, in their type (GPT-OSS's)
  bool router_logit_bias = false;   // the router's logits with a trained bias ("gate.bias", GPT-OSS's)
  bool router_top_sigmoid = false;  // the sigmoid of the chosen experts' logits, in float32, then the model's type (Llama 4's)
  bool router_scales_input = false; // a chosen expert's weight scales its input, not its output (Llama 4's)
  bool grouped_experts = false;     // the experts' products as grouped GEMMs over their stacked weights, no host read ("experts_kernel")
  bool shared_expert_gate = true;  // it scaled by sigmoid(shared_expert_gate(x)); false: added as is (GraniteMoeShared's)
  // The router (MoeImpl): DeepSeek-V3's sigmoid scores in the softmax's place, chosen with a
  // correction bias within the best groups, renormalized, scaled; DeepSeek-V2's softmax within
  // the best groups.
  bool router_sigmoid = false;    // sigmoid scores; normalize_experts divides by their sum + 1e-20
  bool router_bias = false;       // sigmoid: e_score_correction_bias (a buffer) added to the scores to choose
  int64_t expert_groups = 1;      // the experts in that many groups; a token's chosen from the
  int64_t groups_per_token = 1;   //   groups_per_token of highest top-2 score sum (sigmoid) or best score (softmax)
  double routed_scale = 1;        // the chosen experts' weights times this (routed_scaling_factor)
  bool router_float32 = false;    // lower precisions compute the router's scores in float32 (from both operands cast)
  // DeepSeek's multi-head latent attention (MlaAttentionImpl) where kv_lora_rank > 0: head_dim is
  // a query's and key's values (rope_head_dim rotated at the end), v_head_dim a value's;
  // n_kv_heads equals n_heads.
  int64_t kv_lora_rank = 0, q_lora_rank = 0;  // q_lora_rank 0: queries projected directly (q_proj)
  int64_t rope_head_dim = 0, v_head_dim = 0;
  bool rope_interleave = false;  // the rotated values taken as interleaved pairs (DeepSeek-V3's checkpoints; Llama 4's, GLM-4's, Ernie 4.5's without latents)
  bool rope_pairs_kept = false;  // with rope_interleave: the rotated pairs put back interleaved (DeepSeek-V2's)
  double latent_eps = 1e-6;      // the latents' RMSNorms' epsilon
  bool mla() const { return kv_lora_rank > 0; }
  bool attn_output_gate = false;  // q_proj also gives a gate per head; attention's output times its sigmoid (Qwen3-Next's)
  // Qwen3-Next's gated DeltaNet (GatedDeltaNetImpl) in attention's place where linear_key_heads > 0.
  int64_t linear_key_heads = 0, linear_value_heads = 0, linear_key_head_dim = 0, linear_value_head_dim = 0;
  int64_t linear_conv_kernel = 4;
  bool linear_split = false;  // in_proj_qkv, in_proj_z, in_proj_b, in_proj_a (Qwen3.5's), not in_proj_qkvz and in_proj_ba
  bool gated_deltanet() const { return linear_key_heads > 0; }
  // Mamba 2's mixer (Mamba2MixerImpl) in attention's place where mamba_heads > 0 (Granite 4.0-H's).
  int64_t mamba_heads = 0, mamba_head_dim = 0, mamba_state = 0, mamba_groups = 1, mamba_conv_kernel = 4, mamba_chunk = 256;
  bool mamba_conv_bias = true, mamba_proj_bias = false;
  double mamba_dt_min = 0, mamba_dt_max = std::numeric_limits<double>::infinity();  // the steps' clamp
  bool mamba() const { return mamba_heads > 0; }
  // Nemotron-H's blocks of one part: without a token mixer (x + mlp(post_attention_layernorm(x)))
  // or without an MLP (x + mixer(input_layernorm(x))).
  bool no_mixer = false, no_mlp = false;
  // Keyed dropout (training alone): of the attention weights, and of attention's and the MLP's
  // outputs before their residual adds (StarCoder2's and Seed-OSS's attention_dropout, residual_dropout).
  double dropout = 0, attn_dropout = 0;
  Lora lora;  // low-rank adapters beside the attention's and the dense MLP's projections (models/lora.h)
};

/// q, k, v and o projections of grouped-query attention ("self_attn" of a Llama block), and with
/// qk_norm the RMSNorms over each head's queries and keys (Qwen3's q_norm and k_norm; with
/// qk_norm_each_head a weight per head, [n_heads or n_kv_heads, head_dim]).
class LlamaAttentionImpl : public torch::nn::Cloneable<LlamaAttentionImpl> {
 public:
  explicit LlamaAttentionImpl(LlamaBlockOptions o) : o_(std::move(o)) { reset(); }
  void reset() override;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RmsNorm q_norm{nullptr}, k_norm{nullptr};  ///< with qk_norm only
  at::Tensor sinks;                          ///< [n_heads], with attn_sinks only

 private:
  LlamaBlockOptions o_;
};
TORCH_MODULE(LlamaAttention);

/// DeepSeek's multi-head latent attention ("self_attn"): queries through q_proj, or q_a_proj, its
/// RMSNorm q_a_layernorm and q_b_proj (q_lora_rank > 0); one projection kv_a_proj_with_mqa to a
/// latent of kv_lora_rank (RMS-normalized by kv_a_layernorm, then expanded by kv_b_proj to each
/// head's unrotated key and value) and one rotated key of rope_head_dim shared by every head;
/// o_proj. qkv_bias: biases on q_a_proj (or none on q_proj) and kv_a_proj_with_mqa; o_bias: on o_proj.
class MlaAttentionImpl : public torch::nn::Cloneable<MlaAttentionImpl> {
 public:
  explicit MlaAttentionImpl(LlamaBlockOptions o) : o_(std::move(o)) { reset(); }
  void reset() override;
  torch::nn::Linear q_proj{nullptr}, q_a_proj{nullptr}, q_b_proj{nullptr};  ///< q_proj, or the other two with q_lora_rank
  RmsNorm q_a_layernorm{nullptr};                                            ///< with q_lora_rank only
  torch::nn::Linear kv_a_proj_with_mqa{nullptr}, kv_b_proj{nullptr}, o_proj{nullptr};
  RmsNorm kv_a_layernorm{nullptr};

 private:
  LlamaBlockOptions o_;
};
TORCH_MODULE(MlaAttention);

/// Qwen3-Next's gated DeltaNet ("linear_attn"), as transformers computes it: in_proj_qkvz gives,
/// for each of linear_key_heads groups, a query and a key of linear_key_head_dim and the values and
/// output gates z of its linear_value_heads / linear_key_heads value heads of linear_value_head_dim;
/// in_proj_ba a write strength b and a decay input a per value head. Queries, keys and values go
/// through a causal depthwise convolution of linear_conv_kernel positions (conv1d, no bias) and
/// SiLU (with linear_split, Qwen3.5's: in_proj_qkv gives every head's query, then key, then value,
/// in_proj_z the output gates, in_proj_b and in_proj_a b and a); the gated delta rule (queries and keys L2-normalized, queries scaled by
/// 1/sqrt(linear_key_head_dim), beta = sigmoid(b), decay g = -exp(A_log) * softplus(a + dt_bias))
/// runs by chunks of 64 positions in float32 at least (float64 stays float64), as transformers'
/// torch fallback runs it; its output goes through an RMSNorm (norm, weight as Llama's) times
/// silu(z), then out_proj. In generation it keeps its convolution's last inputs and the rule's
/// state (KvCache::conv, KvCache::state) in place of keys and values.
class GatedDeltaNetImpl : public torch::nn::Cloneable<GatedDeltaNetImpl> {
 public:
  explicit GatedDeltaNetImpl(LlamaBlockOptions o) : o_(std::move(o)) { reset(); }
  void reset() override;
  /// h [B, T, d_model] (input_layernorm's output) to the layer's output [B, T, d_model]; with
  /// `cache`, h holds the positions after those the cache's convolution inputs and state stand
  /// for, which it carries on (one position at a time: the rule step by step, as transformers'
  /// generation runs it).
  torch::Tensor forward(const torch::Tensor& h, KvCache* cache = nullptr);
  torch::nn::Linear in_proj_qkvz{nullptr}, in_proj_ba{nullptr}, out_proj{nullptr};
  torch::nn::Linear in_proj_qkv{nullptr}, in_proj_z{nullptr}, in_proj_b{nullptr}, in_proj_a{nullptr};  ///< linear_split's
  torch::nn::Conv1d conv1d{nullptr};  ///< depthwise over the queries', keys' and values' channels
  at::Tensor dt_bias, A_log;          ///< [linear_value_heads] each
  RmsNorm norm{nullptr};              ///< [linear_value_head_dim]

 private:
  LlamaBlockOptions o_;
};
TORCH_MODULE(GatedDeltaNet);

/// The causal depthwise convolution of x [B, channels, T] by weight [channels, 1, K] (and bias,
/// where defined), [B, channels, T]: the DeltaNet's and Mamba 2's. With `cache`, x holds the
/// positions after those whose last K - 1 inputs the cache keeps (KvCache::conv), which it
/// replaces by the last K - 1 of these.
at::Tensor causal_depthwise_conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, KvCache* cache);

/// Mamba 2's mixer ("mamba"), as transformers' torch path computes it (Granite 4.0-H's):
/// in_proj gives the gate z [mamba_heads·mamba_head_dim = I], the convolution's input xBC (I
/// values, then B and C of mamba_groups·mamba_state each) and dt [mamba_heads]; xBC goes through a
/// causal depthwise convolution of mamba_conv_kernel positions (conv1d, with a bias where
/// mamba_conv_bias) and SiLU; dt = clamp(softplus(dt + dt_bias)), A = -exp(A_log); the scan
/// (mamba2_chunk_scan) by chunks of mamba_chunk positions in float32 at least; its output times
/// silu(z), RMS-normalized by groups of I / mamba_groups (norm.weight), then out_proj. In
/// generation it keeps its convolution's last inputs and the scan's state (KvCache::conv,
/// KvCache::state), stepping one position at a time.
class Mamba2MixerImpl : public torch::nn::Cloneable<Mamba2MixerImpl> {
 public:
  explicit Mamba2MixerImpl(LlamaBlockOptions o) : o_(std::move(o)) { reset(); }
  void reset() override;
  /// h [B, T, d_model] (input_layernorm's output) to the layer's output [B, T, d_model]; with
  /// `cache`, h holds the positions after those the cache stands for, which it carries on.
  torch::Tensor forward(const torch::Tensor& h, KvCache* cache = nullptr);
  torch::nn::Linear in_proj{nullptr}, out_proj{nullptr};
  torch::nn::Conv1d conv1d{nullptr};  ///< depthwise over xBC's channels
  at::Tensor dt_bias, A_log, D;       ///< [mamba_heads] each
  RmsNorm norm{nullptr};              ///< its weight [mamba_heads·mamba_head_dim] (the gated norm by groups)

 private:
  LlamaBlockOptions o_;
};
TORCH_MODULE(Mamba2Mixer);

/// Mamba 2's scan (the state space duality's chunked form) as transformers' torch_forward computes
/// it, its operations in its order: x [B, T, H, P], dt [B, T, H] (the steps, after softplus and
/// the clamp), A [H] (negative), Bm and C [B, T, G, N] (G divides H: each group serves H / G
/// consecutive heads), D [H]. The state S [B, H, P, N] of each head takes S·exp(dt·A) + dt·x·Bᵀ at
/// each position and gives y = S·C + D·x. In float32 for float32 and lower (transformers'), float64
/// for float64; returns [B, T, H, P] in that type. `state` (if given): the state before the first
/// position where defined, replaced by the one after the last. mamba2_recurrent_scan: the same
/// position by position (generation's steps; the float64 reference of the tests).
at::Tensor mamba2_chunk_scan(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A, const at::Tensor& Bm, const at::Tensor& C,
                             const at::Tensor& D, int64_t chunk, at::Tensor* state = nullptr);
at::Tensor mamba2_recurrent_scan(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A, const at::Tensor& Bm, const at::Tensor& C,
                                 const at::Tensor& D, at::Tensor* state = nullptr);

/// The gated delta rule by chunks of `chunk` positions, as transformers' torch_chunk_gated_delta_rule
/// computes it (its operations, in float32 at least): q, k [B, T, Hk, Dk], v [B, T, Hv, Dv] (Hk
/// divides Hv: each query and key serves Hv / Hk consecutive value heads), g and beta [B, T, Hv];
/// queries and keys L2-normalized (eps 1e-6), queries scaled by Dk^-1/2. Returns [B, T, Hv, Dv] in q's type.
/// `state` (if given) [B, Hv, Dk, Dv]: the state before the first position, replaced by the one
/// after the last (in the computation's type).
at::Tensor chunk_gated_delta_rule(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor g, at::Tensor beta, int64_t chunk = 64,
                                  at::Tensor* state = nullptr);
/// The same rule position by position, as transformers' torch_recurrent_gated_delta_rule computes
/// it (generation's steps); `state` as above.
at::Tensor recurrent_gated_delta_rule(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor g, at::Tensor beta,
                                      at::Tensor* state = nullptr);

/// A mixture of experts' router ("gate"): its weight [experts, d_model], with router_logit_bias
/// a trained bias [experts] (GPT-OSS's), and with router_bias the buffer e_score_correction_bias
/// [experts] (DeepSeek-V3's: it shifts which experts are chosen, not their weights; a buffer, as
/// transformers holds it: no gradient).
class RouterImpl : public torch::nn::Cloneable<RouterImpl> {
 public:
  RouterImpl(int64_t experts, int64_t d_model, bool correction, bool logit_bias)
      : experts_(experts), d_model_(d_model), correction_(correction), logit_bias_(logit_bias) {
    reset();
  }
  void reset() override;
  at::Tensor weight, bias, e_score_correction_bias;

 private:
  int64_t experts_, d_model_;
  bool correction_, logit_bias_;
};
TORCH_MODULE(Router);

/// xIELU (Apertus's activation, in transformers' operations): with a = softplus(alpha_p) and
/// b = beta + softplus(alpha_n), a·x² + beta·x where x > 0, else (expm1(min(x, eps)) − x)·b + beta·x;
/// alpha_p and alpha_n trained ([1] each); beta (0.5) and eps (−1e-6) buffers, as transformers
/// holds them (read from and written to a checkpoint, no gradient).
class XieluImpl : public torch::nn::Cloneable<XieluImpl> {
 public:
  XieluImpl() { reset(); }
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x) const;
  at::Tensor alpha_p, alpha_n;  ///< [1] each
  at::Tensor beta, eps;         ///< buffers, 0-dimensional
};
TORCH_MODULE(Xielu);

/// SwiGLU: down(silu(gate(x)) * up(x)) ("mlp" of a Llama block); with `gelu`, a GELU in silu's
/// place (Gemma's GeGLU: the tanh GELU); with `relu2`, relu(gate(x))² in its place; with `oai_alpha` > 0,
/// GPT-OSS's clamped SwiGLU (LlamaBlockOptions). Without `gated`, no gate: down(act(up(x))), act
/// relu² with `relu2` (Arcee's and Nemotron's), xIELU with `xielu` ("act_fn", Apertus's), the GELU
/// `gelu` names (StarCoder2's tanh, GPT-NeoX's exact, Phi's gelu_new), SiLU otherwise. With
/// `bias_apart`, each product rounded before its bias is added (Falcon's), as with `oai_alpha`.
class GatedMlpImpl : public torch::nn::Cloneable<GatedMlpImpl> {
 public:
  GatedMlpImpl(int64_t d_model, int64_t d_ff, bool bias, Gelu gelu = Gelu::None, double oai_alpha = 0, double oai_limit = 0,
               bool relu2 = false, bool gated = true, bool xielu = false, bool bias_apart = false, Lora lora = {})
      : d_model_(d_model), d_ff_(d_ff), bias_(bias), gelu_(gelu), relu2_(relu2), gated_(gated), xielu_(xielu), bias_apart_(bias_apart), oai_alpha_(oai_alpha),
        oai_limit_(oai_limit), lora_(std::move(lora)) {
    reset();
  }
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);
  /// The product of the activated gate's and up's outputs (their biases added), down's input.
  at::Tensor activate(const at::Tensor& gate, const at::Tensor& up) const;
  torch::nn::Linear gate_proj{nullptr};  ///< gated only
  torch::nn::Linear up_proj{nullptr}, down_proj{nullptr};
  Xielu act_fn{nullptr};  ///< xielu only

 private:
  at::Tensor act(const at::Tensor& x) const;  // the activation alone
  int64_t d_model_, d_ff_;
  bool bias_;
  Gelu gelu_;
  bool relu2_, gated_, xielu_, bias_apart_;
  double oai_alpha_, oai_limit_;
  Lora lora_;  // adapters of gate, up and down (a block's dense MLP)
};
TORCH_MODULE(GatedMlp);

/// A sparse mixture of experts in a Llama block's MLP place, as transformers computes Mixtral's
/// and Qwen3-MoE's: a router ("gate", [experts, d_model], no bias) scores each token; the softmax
/// of the scores (float32 at least) picks its top `experts_per_token` experts, whose SwiGLU MLPs
/// ("experts.<e>", GatedMlp) run on the tokens routed to them, expert by expert in ascending
/// order, and whose outputs add up weighted by those probabilities (renormalized over the chosen
/// with normalize_experts; with router_scales_input, the weights scale the experts' inputs); with
/// router_sigmoid, DeepSeek-V3's routing; with router_top_sigmoid, Llama 4's (LlamaBlockOptions). The
/// routing is read on the host (one sync per layer); with grouped_experts, the experts' products
/// run instead as grouped GEMMs (at::_grouped_mm) over the rows sorted by expert and their weights
/// stacked, as transformers' "grouped_mm" experts do, with no host read (a CUDA graph can replay
/// them), where the kernel takes the type (float32, bfloat16, float16) and rows of a multiple of
/// 16 bytes; the loop runs otherwise. With
/// `shared_expert` (Qwen2-MoE's), every token also goes through one more SwiGLU MLP of that width
/// ("shared_expert"), scaled by sigmoid(shared_expert_gate(x)) ([1, d_model], no bias; without
/// the gate where `shared_expert_gate` is false, GraniteMoeShared's), added to
/// the experts' sum.
class MoeImpl : public torch::nn::Cloneable<MoeImpl> {
 public:
  explicit MoeImpl(LlamaBlockOptions o) : o_(std::move(o)) { reset(); }
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);
  Router gate{nullptr};
  torch::nn::ModuleList experts{nullptr};
  GatedMlp shared_expert{nullptr};               ///< with shared_expert only
  torch::nn::Linear shared_expert_gate{nullptr};  ///< with shared_expert and shared_expert_gate only
  torch::nn::Linear fc1_latent_proj{nullptr}, fc2_latent_proj{nullptr};  ///< with experts_latent only: into and out of the latent

 private:
  // Each token's chosen experts' weights and the experts [N, experts_per_token], of h [N, d_model].
  std::pair<at::Tensor, at::Tensor> route(const at::Tensor& h);
  // The routed experts' weighted sum [N, d_model] of h [N, d_model]: expert by expert, or grouped.
  at::Tensor looped(const at::Tensor& h, const at::Tensor& top, const at::Tensor& chosen);
  at::Tensor grouped(const at::Tensor& h, const at::Tensor& top, const at::Tensor& chosen);
  // Why the grouped kernel cannot take h here ("" where it can).
  std::string why_not_grouped(const at::Tensor& h) const;
  LlamaBlockOptions o_;
};
TORCH_MODULE(Moe);

/// A Llama-family decoder layer: x + o(attn(rope(q), rope(k), v)) of input_layernorm(x), then
/// h + mlp(post_attention_layernorm(h)); its norms placed otherwise for OLMo 2 and Gemma 2 and 3
/// (NormPlacement); DeepSeek's latent attention in place of grouped-query attention where
/// kv_lora_rank > 0. Input and output [B, T, d_model].
class LlamaBlockImpl : public torch::nn::Cloneable<LlamaBlockImpl> {
 public:
  /// `stream`: the first of the three dropout streams the block takes where it drops (layer_list.cpp numbers them).
  explicit LlamaBlockImpl(LlamaBlockOptions o, uint64_t stream = 0) : o_(std::move(o)), stream_(stream) { reset(); }
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x) { return forward_cached(x, nullptr); }
  /// With `cache`: x holds the positions after those cached, which it extends.
  torch::Tensor forward_cached(const torch::Tensor& x, KvCache* cache);
  const LlamaBlockOptions& options() const { return o_; }

 private:
  // Attention's output (before o_proj) for h, input_layernorm's output: grouped-query or latent.
  at::Tensor attention(const at::Tensor& h, KvCache* cache);
  at::Tensor latent_attention(const at::Tensor& h, KvCache* cache);
  // q and k [B, *, T, head] rotated for positions offset..offset+T-1 (their first rotary_dim
  // values, of a head of head_dim).
  std::pair<at::Tensor, at::Tensor> rotate(at::Tensor q, at::Tensor k, int64_t head_dim, int64_t offset, KvCache* cache);
  LlamaBlockOptions o_;
  uint64_t stream_;
  Dropout attn_drop_{nullptr}, resid_drop_{nullptr}, mlp_drop_{nullptr};  // where options() drop
  RmsNorm input_layernorm_{nullptr}, post_attention_layernorm_{nullptr};
  RmsNorm pre_feedforward_layernorm_{nullptr}, post_feedforward_layernorm_{nullptr};
  LlamaAttention self_attn_{nullptr};
  MlaAttention mla_{nullptr};  // in self_attn_'s place where options().mla()
  GatedDeltaNet linear_attn_{nullptr};  // in their place where options().gated_deltanet()
  Mamba2Mixer mamba_{nullptr};          // or options().mamba()
  GatedMlp mlp_{nullptr};
  Moe moe_{nullptr};  // in mlp_'s place where options().experts > 0
  // rope_inv_freq on the device the block last ran on, for the dtype it ran in (and longrope's
  // long factors'): made once, so that a forward copies nothing from the host (no stream sync;
  // capturable in a CUDA graph); dynamic's past its positions again for each new length.
  at::Tensor rope_inv_, rope_inv_long_;
  int64_t rope_dynamic_length_ = 0;  // the length rope_inv_ grew dynamic's base for
  at::ScalarType rope_type_ = at::kFloat;
};
TORCH_MODULE(LlamaBlock);

struct Gpt2BlockOptions {
  int64_t d_model = 0, n_heads = 0, d_ff = 0;
  double eps = 1e-5;
  double dropout = 0;       // resid_pdrop: after each sublayer's output projection
  double attn_dropout = 0;  // attn_pdrop: of the attention weights
  bool gelu_new = false;    // the MLP's GELU as transformers' gelu_new writes it, op by op (not the fused tanh GELU)
};

/// GPT-2's c_attn (q, k, v in one) and c_proj ("attn"). The weights are [out, in] as torch's
/// linear layers hold them; transformers' Conv1D holds their transposes.
class Gpt2AttentionImpl : public torch::nn::Cloneable<Gpt2AttentionImpl> {
 public:
  explicit Gpt2AttentionImpl(int64_t d_model) : d_model_(d_model) { reset(); }
  void reset() override;
  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};

 private:
  int64_t d_model_;
};
TORCH_MODULE(Gpt2Attention);

/// GPT-2's c_fc and c_proj with the tanh GELU between ("mlp").
class Gpt2MlpImpl : public torch::nn::Cloneable<Gpt2MlpImpl> {
 public:
  Gpt2MlpImpl(int64_t d_model, int64_t d_ff) : d_model_(d_model), d_ff_(d_ff) { reset(); }
  void reset() override;
  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};

 private:
  int64_t d_model_, d_ff_;
};
TORCH_MODULE(Gpt2Mlp);

/// GPT-2's block in transformers' layout: x + attn(ln_1(x)), then h + mlp(ln_2(h)). Three
/// dropout streams from `stream` (attention weights, attention output, MLP output).
class Gpt2BlockImpl : public torch::nn::Cloneable<Gpt2BlockImpl> {
 public:
  Gpt2BlockImpl(Gpt2BlockOptions o, uint64_t stream) : o_(o), stream_(stream) { reset(); }
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x) { return forward_cached(x, nullptr); }
  torch::Tensor forward_cached(const torch::Tensor& x, KvCache* cache);

 private:
  Gpt2BlockOptions o_;
  uint64_t stream_;
  torch::nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  Gpt2Attention attn_{nullptr};
  Gpt2Mlp mlp_{nullptr};
  Dropout attn_drop_{nullptr}, resid_drop_{nullptr}, mlp_drop_{nullptr};
};
TORCH_MODULE(Gpt2Block);

/// The blocks' arguments as a layer list spells them (decoder_options.cpp): llama_block's
/// d_model, n_heads, n_kv_heads, head_dim, d_ff, eps, rope_theta, partial_rotary_factor, rope_scaling, qkv_bias,
/// o_bias, mlp_bias, qk_norm, qk_norm_over, sliding_window, norms, norm_scale, norm_center, norm_bias, act, attn_scale, attn_softcap, experts,
/// swiglu_alpha, swiglu_limit, attn_sinks, experts_per_token, normalize_experts, router_cast, experts_sum_float32, experts_latent, shared_expert,
/// shared_expert_gate, router, router_logit_bias, router_bias, expert_groups, groups_per_token, routed_scale,
/// router_float32, kv_lora_rank, q_lora_rank, rope_head_dim, v_head_dim, rope_interleave, rope_pairs_kept, latent_eps,
/// rope_float32, rope_tables_rounded, clip_qkv, residual_scale, rotary, q_scale_beta, q_scale_length, attention_chunk, qk_l2_norm,
/// q_temperature, q_temperature_floor, router_scales_input, experts_kernel, mlp_gate, qk_norm_after_rope, attn_output_gate,
/// linear_key_heads, linear_value_heads, linear_key_head_dim, linear_value_head_dim, linear_conv_kernel, linear_projections,
/// mamba_heads, mamba_head_dim, mamba_state, mamba_groups, mamba_conv_kernel, mamba_chunk, mamba_conv_bias, mamba_proj_bias,
/// mamba_dt_min, mamba_dt_max, mixer, mlp, dropout, attn_dropout;
/// gpt2_block's d_model, n_heads, d_ff, eps, dropout, act,
/// attn_dropout. A bad value is the reader's ConfigError naming the key.
LlamaBlockOptions read_llama_block(JsonReader& r);
/// An RMSNorm's `key` ("after_cast", "before_cast" or "one_plus"; RmsScale).
RmsScale read_rms_scale(JsonReader& r, const std::string& key);
Gpt2BlockOptions read_gpt2_block(JsonReader& r);
/// The values of a block's parameters, counted before any tensor is made.
double parameter_values(const LlamaBlockOptions& o);
double parameter_values(const Gpt2BlockOptions& o);

}  // namespace pipetrain::models
