// Building blocks shared by the model families. Random layers draw from the pipeline's
// RNG context (common/rng.h) so their masks are independent of micro-batching.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

namespace pipetrain::models {

// Inverted dropout whose mask for sample i comes from a generator keyed by
// (seed, step, stream, global sample index) of the current RNG context.
class DropoutImpl : public torch::nn::Cloneable<DropoutImpl> {
 public:
  DropoutImpl(double p, uint64_t stream) : p_(p), stream_(stream) {}
  void reset() override {}
  torch::Tensor forward(const torch::Tensor& x);
  double p() const { return p_; }

 private:
  double p_;
  uint64_t stream_;
};
TORCH_MODULE(Dropout);

// Linear + ReLU (optional). With `flatten`, image-shaped input [N, C, H, W] is flattened to
// [N, C*H*W] first; without it the linear acts on the last dimension.
class DenseImpl : public torch::nn::Cloneable<DenseImpl> {
 public:
  DenseImpl(int64_t in, int64_t out, bool relu, double dropout = 0.0, uint64_t stream = 0,
            bool flatten = true);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int64_t in_, out_;
  bool relu_;
  double dropout_p_;
  bool flatten_;
  uint64_t stream_;
  torch::nn::Linear linear_{nullptr};
  Dropout dropout_{nullptr};
};
TORCH_MODULE(Dense);

// Conv2d 3x3 (same padding) + ReLU, then an optional 2x2 max-pool.
class ConvBlockImpl : public torch::nn::Cloneable<ConvBlockImpl> {
 public:
  ConvBlockImpl(int64_t in, int64_t out, bool pool);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int64_t in_, out_;
  bool pool_;
  torch::nn::Conv2d conv_{nullptr};
};
TORCH_MODULE(ConvBlock);

// Token embedding + learned position embedding + dropout.
class EmbeddingImpl : public torch::nn::Cloneable<EmbeddingImpl> {
 public:
  EmbeddingImpl(int64_t vocab, int64_t seq_len, int64_t d_model, double dropout, uint64_t stream);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& tokens);

 private:
  int64_t vocab_, seq_len_, d_model_;
  double dropout_p_;
  uint64_t stream_;
  torch::nn::Embedding tok_{nullptr}, pos_{nullptr};
  Dropout dropout_{nullptr};
};
TORCH_MODULE(Embedding);

// Pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)), causal self-attention.
class BlockImpl : public torch::nn::Cloneable<BlockImpl> {
 public:
  BlockImpl(int64_t d_model, int64_t n_heads, int64_t d_ff, double dropout, uint64_t stream);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int64_t d_model_, n_heads_, d_ff_;
  double dropout_p_;
  uint64_t stream_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr}, fc1_{nullptr}, fc2_{nullptr};
  Dropout attn_drop_{nullptr}, resid_drop_{nullptr}, mlp_drop_{nullptr};
};
TORCH_MODULE(Block);

// LayerNorm over the last dimension (the final norm of a transformer).
class NormImpl : public torch::nn::Cloneable<NormImpl> {
 public:
  explicit NormImpl(int64_t d_model);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int64_t d_model_;
  torch::nn::LayerNorm ln_{nullptr};
};
TORCH_MODULE(Norm);

}  // namespace pipetrain::models
