// Text generation from a byte-level language model (the `gpt` family with vocab_size 256, as
// trained on data.kind text): one byte at a time, each conditioned on the last seq_len bytes.
#pragma once

#include <cstdint>
#include <string>

#include <torch/nn/modules/container/sequential.h>

namespace pipetrain::models {

struct GenerateOptions {
  int64_t new_bytes = 256;   // bytes to generate
  int64_t seq_len = 0;       // the model's context (model.seq_len); required
  double temperature = 1.0;  // logits are divided by it; 0: greedy (the most likely byte)
  int64_t top_k = 0;         // sample among the k most likely bytes; 0: all 256
  uint64_t seed = 0;         // the same seed, model and prompt give the same bytes
};

// Samples `new_bytes` bytes that follow `prompt` (an empty prompt starts from "\n") and returns
// them, without the prompt. The model runs in eval mode without gradients (its training mode is
// restored afterwards) and must map [1, T] int64 byte ids (T <= seq_len) to [1, T, 256] logits.
// Bad options are a one-line ConfigError naming the option.
std::string generate(torch::nn::Sequential& model, const std::string& prompt, const GenerateOptions& options);

}  // namespace pipetrain::models
