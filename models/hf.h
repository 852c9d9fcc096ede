// The `hf` family: a causal language model written by Hugging Face's transformers
// (`save_pretrained`: config.json and model.safetensors, or shards with
// model.safetensors.index.json) built as the equivalent layer list carrying the checkpoint's
// weights, and such a list's weights written back in the same form (`pipetrain export --format
// hf`). Architectures: those hf_architectures() lists (the Llama family's, mixtures of experts and
// the DeepSeeks' latent attention as llama_block, GPT-2 as gpt2_block). A config field that would change the math and
// is not supported is a one-line ConfigError naming it; never a silently different model. Tests:
// tests/hf_test.cpp, tests/hf_models.py (against transformers).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/hf_quantized.h"
#include "models/model.h"
#include "models/safetensors.h"

namespace pipetrain::models {

/// The architectures the family reads.
const std::vector<std::string>& hf_architectures();

/// One parameter: our name ("layer_0.llama.self_attn.q_proj.weight") and the checkpoint's
/// ("model.layers.0.self_attn.q_proj.weight"); `transposed`: the checkpoint holds the transpose
/// (GPT-2's Conv1D weights).
struct HfTensor {
  std::string ours, theirs;
  bool transposed = false;
  /// `rows` > 0: ours is rows [row_offset, row_offset + rows) of theirs, a fused tensor (Phi-3's
  /// qkv_proj and gate_up_proj), which the parts of the same name make up whole in row order.
  int64_t row_offset = 0, rows = 0;
  /// `slice` >= 0: theirs is a stack of tensors (GraniteMoE's experts, [experts, ...]) and ours is
  /// theirs[slice] (transposed where `transposed`), or its rows as above; the parts of the same name
  /// make it up whole in slice order.
  int64_t slice = -1;
  /// With `rows`: every row_step-th row from row_offset (GPT-OSS's experts' gate and up, interleaved),
  /// or blocks of row_block rows, every row_step-th row from row_offset (GPT-NeoX's query_key_value:
  /// each head's queries, keys and values in turn).
  int64_t row_step = 1;
  int64_t row_block = 1;
  /// `ours_row` >= 0: theirs is row ours_row of ours (StableLM's per-head q/k norms, one tensor a
  /// head); the parts of the same ours make it up whole.
  int64_t ours_row = -1;
};

/// A checked config.json: the architecture, the layer list that computes the same model (the
/// `layers` family's keys, for windows of `seq_len` tokens), and every parameter's two names.
struct HfSpec {
  std::string architecture;
  nlohmann::json config;
  nlohmann::json layers;
  std::vector<HfTensor> tensors;
  bool tied = false;  // the output head is the token embedding (tie_word_embeddings)
  /// Prefixes of the checkpoint's tensors that are not part of the model and are not read
  /// (DeepSeek-V3's multi-token prediction layers after num_hidden_layers, as transformers skips
  /// them; Llama 4's vision model and projector beside its language model).
  std::vector<std::string> ignored;
  /// A quantized checkpoint's method (models/hf_quantized.h): its weights are read dequantized.
  HfQuantization quantization;
};

/// Reads and checks `dir`/config.json; `where` prefixes errors (the config key that named dir).
HfSpec read_hf_spec(const std::string& dir, int64_t seq_len, const std::string& where);

/// `hf`: {"family": "hf", "path": DIR, "seq_len": N}. The weights are the checkpoint's; a float64
/// checkpoint builds a float64 model (float32 otherwise: bfloat16 and float16 widen exactly).
Model build_hf(JsonReader& model);

/// Writes `weights` (our names; a merged checkpoint's or a model's parameters) as a directory
/// `from_pretrained` loads: config.json (the source's, its dtype the weights', without a quantized
/// source's quantization_config: the weights are written in their own type), model.safetensors
/// or shards of at most `shard_bytes` with their index, with the source's tensors that are not part
/// of the model (HfSpec::ignored) as the source holds them, and the source's tokenizer and
/// generation files when it has them. `source` is the directory the model was built from. Returns the
/// tensors written.
size_t save_hf(const std::string& source, const std::map<std::string, at::Tensor>& weights, const std::string& out,
               uint64_t shard_bytes);

}  // namespace pipetrain::models
