// Layers that run on the next positions of a sequence alone, given what they kept of the
// positions before: what lets generation (models/generate.h) feed one new token through the model
// instead of the whole window again. A layer list's layers say whether they can (layer_list.cpp):
// those acting on each position apart, an embedding (at a position offset), and the decoder blocks
// (with a KvCache). The layout is a language model's: [batch, positions, ...].
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "models/decoder.h"

namespace pipetrain::models {

class IncrementalLayer {
 public:
  virtual ~IncrementalLayer() = default;
  /// Whether forward_at computes what forward would, in evaluation mode: true for a layer that
  /// acts on each position apart (a linear layer or norm over the features, an activation,
  /// dropout, identity), an embedding and a decoder block (llama_block, gpt2_block); false for
  /// one that mixes positions without a cache (transformer_block, a convolution, a reshape).
  virtual bool incremental() const = 0;
  /// The layer's output for positions offset .. offset + T - 1 of x ([B, T, ...]), the positions
  /// before having gone through earlier calls with the same `cache`, which this one extends.
  virtual at::Tensor forward_at(const at::Tensor& x, int64_t offset, KvCache& cache) = 0;
};

}  // namespace pipetrain::models
