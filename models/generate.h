// Generation from a language model, one token at a time: token ids from any model that maps
// [1, T] int64 ids to [1, T, vocab] logits (the hf family's, a layer list that starts with an
// embedding, the gpt family), and text from a byte-level one (vocab_size 256, as trained on
// data.kind text).
//
// When every layer of the list can run on the next positions alone (models/incremental.h: a layer
// list of an embedding, llama_block or gpt2_block decoders, norms, linear layers, activations —
// the hf family), the prompt runs once and each new token then runs alone against the keys and
// values the decoder blocks kept (a KV cache). Otherwise (a transformer_block, a convolution, a
// model not built as a layer list, such as the gpt family) every token re-runs the whole window,
// as options.cache = false does for any model.
//
// The context is the model's window, seq_len positions: each token is conditioned on the last
// seq_len tokens (at most) of the prompt and what followed it. Beyond the window generation slides:
// positions are counted from the window's start, so the cached path runs the last window again
// from position 0 when it is full, and from then on costs what the uncached path costs. Both paths
// thus compute the same thing (to float rounding) at every length.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/modules/container/sequential.h>

namespace pipetrain::models {

struct GenerateOptions {
  int64_t new_tokens = 256;  // tokens (bytes) to generate, at most
  int64_t seq_len = 0;       // the model's window (model.seq_len); required
  double temperature = 1.0;  // logits are divided by it; 0: greedy (the most likely token)
  int64_t top_k = 0;         // sample among the k most likely tokens; 0: all
  uint64_t seed = 0;         // the same seed, model and prompt give the same tokens
  int64_t stop_id = -1;      // generation ends after this token (which it returns); -1: none
  bool cache = true;         // false: re-run the window for every token, whatever the model
};

/// Whether the model's layers all run on the next positions alone, so that generation with
/// options.cache keeps a KV cache instead of re-running the window.
bool generates_incrementally(const torch::nn::Sequential& model);

/// Generates up to `new_tokens` token ids after `prompt` (at least one id; each in [0, vocab),
/// the vocabulary being the size of the logits' last dimension) and returns them, without the
/// prompt. The model runs in evaluation mode without gradients (its training mode is restored
/// afterwards), on its parameters' device. Bad options or ids are a one-line ConfigError naming
/// them.
std::vector<int64_t> generate_tokens(torch::nn::Sequential& model, const std::vector<int64_t>& prompt,
                                     const GenerateOptions& options);

/// generate_tokens for a byte-level model (vocab 256): bytes after `prompt` (an empty prompt
/// starts from "\n"), without the prompt; stop_id, when set, is a byte.
std::string generate(torch::nn::Sequential& model, const std::string& prompt, const GenerateOptions& options);

}  // namespace pipetrain::models
