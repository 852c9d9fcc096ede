// The parts of the `hf` family (models/hf.h) its two files share: the architectures' names, a
// checked reader of config.json's fields, and the Llama family's layer list (hf_llama.cpp: Llama,
// Mistral, Qwen2, Qwen3, Phi-3, OLMo 2, Gemma, Gemma 2, Gemma 3, Granite, SmolLM3, Mixtral, Qwen2-MoE, Qwen3-MoE,
// OLMoE, DeepSeek-V2 and V3, GLM-4.5, GPT-OSS, Llama 4, GLM-4, Ernie 4.5, EXAONE 4, MiniMax-M2, Qwen3-Next, Qwen3.5).
// Not an API:
// programs read models/hf.h.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/strings.h"
#include "models/hf.h"

namespace pipetrain::models::hf_detail {

/// transformers' architecture names (config.json's `architectures`).
inline const std::string kLlama = "LlamaForCausalLM", kMistral = "MistralForCausalLM", kMinistral3 = "Ministral3ForCausalLM", kQwen2 = "Qwen2ForCausalLM",
                         kQwen3 = "Qwen3ForCausalLM", kPhi3 = "Phi3ForCausalLM", kOlmo2 = "Olmo2ForCausalLM", kOlmo3 = "Olmo3ForCausalLM",
                         kGemma = "GemmaForCausalLM", kGemma2 = "Gemma2ForCausalLM", kGemma3 = "Gemma3ForCausalLM",
                         kMixtral = "MixtralForCausalLM", kQwen3Moe = "Qwen3MoeForCausalLM", kOlmoe = "OlmoeForCausalLM",
                         kQwen2Moe = "Qwen2MoeForCausalLM", kGranite = "GraniteForCausalLM", kGraniteMoe = "GraniteMoeForCausalLM",
                         kGraniteMoeShared = "GraniteMoeSharedForCausalLM", kGraniteMoeHybrid = "GraniteMoeHybridForCausalLM",
                         kSmolLM3 = "SmolLM3ForCausalLM", kDeepseekV2 = "DeepseekV2ForCausalLM", kDeepseekV3 = "DeepseekV3ForCausalLM",
                         kGlm4Moe = "Glm4MoeForCausalLM", kGptOss = "GptOssForCausalLM", kLlama4 = "Llama4ForCausalLM",
                         kLlama4Vision = "Llama4ForConditionalGeneration", kGlm4 = "Glm4ForCausalLM", kErnie45 = "Ernie4_5ForCausalLM",
                         kExaone4 = "Exaone4ForCausalLM", kMiniMaxM2 = "MiniMaxM2ForCausalLM", kArcee = "ArceeForCausalLM", kApertus = "ApertusForCausalLM",
                         kHunyuan = "HunYuanDenseV1ForCausalLM", kQwen3Next = "Qwen3NextForCausalLM",
                         kQwen35 = "Qwen3_5ForCausalLM", kQwen35Moe = "Qwen3_5MoeForCausalLM",
                         kQwen35Vision = "Qwen3_5ForConditionalGeneration", kQwen35MoeVision = "Qwen3_5MoeForConditionalGeneration",
                         kNemotronH = "NemotronHForCausalLM", kBamba = "BambaForCausalLM", kCohere = "CohereForCausalLM", kCohere2 = "Cohere2ForCausalLM",
                         kGemma3Vision = "Gemma3ForConditionalGeneration", kMistral3 = "Mistral3ForConditionalGeneration",
                         kLlava = "LlavaForConditionalGeneration", kInternVL = "InternVLForConditionalGeneration",
                         kAyaVision = "AyaVisionForConditionalGeneration",
                         kQwen3VL = "Qwen3VLForConditionalGeneration", kQwen3VLMoe = "Qwen3VLMoeForConditionalGeneration", kQwen2VL = "Qwen2VLForConditionalGeneration",
                         kQwen25VL = "Qwen2_5_VLForConditionalGeneration",
                         kStarcoder2 = "Starcoder2ForCausalLM", kSeedOss = "SeedOssForCausalLM", kGpt2 = "GPT2LMHeadModel",
                         kGptNeoX = "GPTNeoXForCausalLM", kPhi = "PhiForCausalLM", kStableLm = "StableLmForCausalLM",
                         kFalcon = "FalconForCausalLM", kGptJ = "GPTJForCausalLM",
                         kGptBigCode = "GPTBigCodeForCausalLM", kOlmo = "OlmoForCausalLM";

/// Qwen3-Next and Qwen3.5's text models: gated DeltaNet layers around gated attention.
inline bool qwen_hybrid(const std::string& arch) { return arch == kQwen3Next || arch == kQwen35 || arch == kQwen35Moe; }

/// Cohere's Command R and Aya, and Cohere 2's Command R7B and A (its windows, full layers without positions).
inline bool cohere_any(const std::string& arch) { return arch == kCohere || arch == kCohere2; }

/// Granite 4.0-H and Bamba: Mamba 2 layers around attention, their mixers under "mamba.".
inline bool mamba_hybrid(const std::string& arch) { return arch == kGraniteMoeHybrid || arch == kBamba; }

/// config.json's fields, each checked for its type; a problem names the file and the field.
class Fields {
 public:
  /// Reads `j` where it lives (it must outlive the reader); `where` prefixes every error.
  Fields(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {}
  /// Throws the ConfigError "<where>: <key> <msg>".
  [[noreturn]] void fail(const std::string& key, const std::string& msg) const { throw ConfigError(where_ + ": " + key + " " + msg); }
  /// What prefixes every error.
  const std::string& where() const { return where_; }
  /// Whether `key` is present and not null.
  bool has(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  /// Whether `key` is present as null (transformers' None, which overrides a default).
  bool at_null(const std::string& key) const { return j_.contains(key) && j_.at(key).is_null(); }
  /// The value of a present `key`.
  const nlohmann::json& at(const std::string& key) const { return j_.at(key); }
  /// An integer in [min, max], `def` where absent (an error where absent and `required`).
  int64_t integer(const std::string& key, int64_t def, int64_t min, int64_t max, bool required = false) const {
    if (!has(key)) {
      if (required) fail(key, "is missing");
      return def;
    }
    const nlohmann::json& v = j_.at(key);
    if (!v.is_number_integer()) fail(key, "must be an integer, got " + v.dump());
    const int64_t x = v.get<int64_t>();
    if (x < min || x > max) fail(key, detail::concat("must be in [", min, ", ", max, "], got ", x));
    return x;
  }
  /// A number, `def` where absent.
  double number(const std::string& key, double def) const {
    if (!has(key)) return def;
    const nlohmann::json& v = j_.at(key);
    if (!v.is_number()) fail(key, "must be a number, got " + v.dump());
    return v.get<double>();
  }
  /// true or false, `def` where absent.
  bool boolean(const std::string& key, bool def) const {
    if (!has(key)) return def;
    if (!j_.at(key).is_boolean()) fail(key, "must be true or false, got " + j_.at(key).dump());
    return j_.at(key).get<bool>();
  }
  /// A string, `def` where absent.
  std::string string(const std::string& key, const std::string& def) const {
    if (!has(key)) return def;
    if (!j_.at(key).is_string()) fail(key, "must be a string, got " + j_.at(key).dump());
    return j_.at(key).get<std::string>();
  }
  /// A field the supported math needs at this value (or absent): an error naming `why` otherwise.
  void require(const std::string& key, const nlohmann::json& value, const std::string& why) const {
    if (has(key) && j_.at(key) != value) fail(key, j_.at(key).dump() + " is not supported (" + why + ")");
  }

 private:
  const nlohmann::json& j_;
  std::string where_;
};

/// GraniteMoE with or without its shared expert; any Granite (their multipliers and biases).
inline bool granite_moe(const std::string& arch) { return arch == kGraniteMoe || arch == kGraniteMoeShared || arch == kGraniteMoeHybrid; }
inline bool granite_any(const std::string& arch) { return arch == kGranite || granite_moe(arch); }

/// The layers whose MLP is a sparse mixture of experts, and its arguments: Mixtral's, OLMoE's,
/// GraniteMoE's and GPT-OSS's every layer, Qwen2-MoE's and Qwen3-MoE's every decoder_sparse_step-th
/// but those mlp_only_layers names, the DeepSeeks' and GLM-4.5's from first_k_dense_replace on,
/// Llama 4's moe_layers (every interleave_moe_layer_step-th by default; the others dense),
/// MiniMax-M2's every layer; the shared experts.
struct Experts {
  nlohmann::json args;       ///< the llama_block's experts, experts_per_token, router, d_ff, shared_expert, …
  std::vector<bool> layers;  ///< which layers
  /// Whether any layer holds one.
  bool any() const { return !args.empty(); }
};

/// The mixtures of experts of `arch`'s n layers as config.json describes them (hf_experts.cpp).
Experts read_experts(const std::string& arch, const Fields& f, int64_t n);

/// An expert layer's MLP tensors, ours under `ours` ("layer_3.llama.") and theirs under `theirs`
/// ("model.layers.3."): the router, each expert's, the shared expert's (hf_experts.cpp).
void expert_tensors(const std::string& arch, const Experts& x, int64_t d_ff, const std::string& ours, const std::string& theirs,
                    HfSpec& spec);

/// Qwen3-Next's and Qwen3.5's layers of gated DeltaNet in attention's place (layer_types'
/// linear_attention; by default all but every fourth), Granite 4.0-H's of Mamba 2 (layer_types'
/// mamba or linear_attention; by default every layer), Bamba's (all but attn_layer_indices), and
/// their llama_block arguments (hf_linear.cpp).
struct LinearLayers {
  std::vector<bool> layers;
  nlohmann::json args;  ///< linear_key_heads, linear_value_heads, linear_key_head_dim, linear_value_head_dim, linear_conv_kernel
};
LinearLayers read_linear_layers(const std::string& arch, const Fields& f, int64_t n);

/// A gated DeltaNet or Mamba 2 layer's tensors, ours under `ours` ("layer_0.llama.") and theirs
/// under `theirs` ("model.layers.0."), in `arch`'s layout (hf_linear.cpp); `x` as read.
void linear_attention_tensors(const std::string& arch, const LinearLayers& x, const std::string& ours, const std::string& theirs,
                              HfSpec& spec);

/// A Mamba 2 mixer's tensors under "mamba." (ours) and transformers' mixer: in_proj, conv1d,
/// dt_bias, A_log, D, norm, out_proj, and the biases `args` (a llama_block's mamba_*) give it (hf_linear.cpp).
std::vector<std::string> mamba_tensor_names(const nlohmann::json& args);

/// Granite 4.0-H's layers without experts: their MLP is shared_mlp (gate's rows, then up's, in
/// input_linear; output_linear), of `d_ff` (hf_experts.cpp).
void granite_dense_mlp_tensors(int64_t d_ff, const std::string& ours, const std::string& theirs, HfSpec& spec);

/// Which layers rotate q and k in Granite 4.0-H: every one where position_embedding_type is
/// "rope", none where it is null or "nope" (hf_linear.cpp).
bool granite_hybrid_rotary(const Fields& f);

/// Cohere's llama_block arguments over Llama's: one norm feeding attention and the MLP side by
/// side, centered (LayerNorms without a bias) and scaled before the cast, layer_norm_eps, the
/// rotation of interleaved pairs; with use_qk_norm (CohereForCausalLM's alone) Command R+'s norms of
/// each head's queries and keys, a weight per head (hf_cohere.cpp).
void cohere_args(const Fields& f, const std::string& arch, nlohmann::json& block);

/// Cohere's logit_scale (0.0625 by default) as a scale layer after the head (hf_cohere.cpp).
void cohere_logit_scale(const Fields& f, HfSpec& spec);

/// Appends the output head (lm_head, tied to the token embedding parameter `embed` when `tied`)
/// to `layers`, and makes spec.layers the list for windows of `seq_len` tokens.
void with_head(HfSpec& spec, nlohmann::json& layers, int64_t d, int64_t vocab, int64_t seq_len, bool tied, const std::string& embed);

/// Nemotron-H's spec: embed, layer_0..n-1 (llama_blocks of one part each: Mamba 2, attention
/// without positions, a relu² MLP or relu² experts), norm, lm_head (hf_nemotron.cpp).
void nemotron_h(const Fields& f, int64_t seq_len, HfSpec& spec);

/// The Llama family's spec (`arch` one of its architectures): embed, layer_0..n-1 (llama_block),
/// norm, lm_head (and Gemma 2's softcap, Granite's scales), with every parameter's two names.
void llama_family(const std::string& arch, const Fields& f, int64_t seq_len, HfSpec& spec);

/// StarCoder2: Mistral's layers with LayerNorms, an MLP without a gate through the tanh GELU,
/// biases by use_bias, under its names (hf_starcoder.cpp).
void starcoder2(const Fields& f, const nlohmann::json& config, int64_t seq_len, HfSpec& spec);

/// Seed-OSS: Llama's layers with biases on q, k, v (attention_bias) and o (attention_out_bias), heads
/// of 128 and padding token 1 by default, its dropouts (hf_seed_oss.cpp).
void seed_oss(const Fields& f, const nlohmann::json& config, int64_t seq_len, HfSpec& spec);

/// A dropout probability of config.json, `def` where absent; in [0, 0.99] or an error naming `key`.
double dropout_probability(const Fields& f, const std::string& key, double def);

/// GPT-2's sizes under its names (vocab_size, n_embd, n_layer, n_head, n_positions, n_inner: 4 ·
/// n_embd where absent), checked: n_head divides n_embd, seq_len within n_positions (hf.cpp).
struct Gpt2Sizes {
  int64_t vocab = 0, d = 0, n = 0, heads = 0, positions = 0, ff = 0;
};
Gpt2Sizes gpt2_sizes(const Fields& f, int64_t seq_len);

/// GPT-2's embedding (tokens, learned positions, `embd_pdrop`, 0.1 where absent) as the layer
/// `embed`; its two tensors' names (transformer.wte, transformer.wpe) added to `spec` (hf.cpp).
nlohmann::json gpt2_embedding(const Fields& f, int64_t vocab, int64_t d, int64_t positions, HfSpec& spec);

/// GPT-NeoX (Pythia): LayerNorms with biases, q, k and v in one tensor head by head, a quarter of
/// each head rotated, attention beside the MLP each with its norm (use_parallel_residual), an exact
/// GELU MLP with biases, its dropouts, an untied head (`embed_out`) (hf_parallel.cpp).
void gpt_neox(const Fields& f, const nlohmann::json& config, int64_t seq_len, HfSpec& spec);

/// Phi (Phi-1, 1.5 and 2): one LayerNorm feeding attention and a gelu_new MLP side by side, half of
/// each head rotated, every bias (the head's too), its dropouts, qk_layernorm (hf_parallel.cpp).
void phi(const Fields& f, const nlohmann::json& config, int64_t seq_len, HfSpec& spec);

/// StableLM (StableLM 2, StableLM-3B): Llama's SwiGLU layers with LayerNorms, a quarter of each
/// head rotated, q/k/v biases by use_qkv_bias, side by side by use_parallel_residual, each head's
/// own q/k LayerNorm by qk_layernorm (hf_parallel.cpp).
void stablelm(const Fields& f, const nlohmann::json& config, int64_t seq_len, HfSpec& spec);

/// Falcon (Falcon-7B, 40B, 180B and the models of its architecture): LayerNorms, q, k and v in one
/// tensor (a key head's group of queries, its key and value with new_decoder_architecture; one key
/// and value for every head with multi_query), attention beside a GELU MLP on one LayerNorm or two
/// (ln_attn, ln_mlp), rotary positions over the whole head, biases by `bias`, tied (hf_parallel.cpp).
void falcon(const Fields& f, const nlohmann::json& config, int64_t seq_len, HfSpec& spec);

/// GPT-J: one LayerNorm feeding attention and a gelu_new MLP side by side, rotary_dim values of
/// each head rotated as interleaved pairs, the MLP's and the head's biases, its dropouts
/// (hf_parallel.cpp).
void gptj(const Fields& f, const nlohmann::json& config, int64_t seq_len, HfSpec& spec);

/// GPT-BigCode (StarCoder 1, SantaCoder): GPT-2's layers (learned positions, LayerNorms, the tanh
/// GELU, every bias) with one key and value head (multi_query), q, k and v in one tensor (c_attn),
/// tied (hf_parallel.cpp).
void gpt_bigcode(const Fields& f, const nlohmann::json& config, int64_t seq_len, HfSpec& spec);

/// OLMo (the first): Llama's layer with LayerNorms without parameters, clip_qkv, padding token 1
/// by default (hf_olmo.cpp).
void olmo(const Fields& f, const nlohmann::json& config, int64_t seq_len, HfSpec& spec);

}  // namespace pipetrain::models::hf_detail
