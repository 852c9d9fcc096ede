// Building blocks shared by the model families. Random layers draw from the pipeline's
// RNG context (common/rng.h) so their masks are independent of micro-batching.
#pragma once

#include <tuple>
#include <vector>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

namespace pipetrain::models {

/// x·weightᵀ + bias, as torch::linear, whose backward adds the weight's gradient into its .grad
/// inside the GEMM when .grad already holds earlier micro-batches' (models/linear.cpp).
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// The keep mask of keyed dropout for samples whose keys are `keys` (common/rng.h's rng_key), each
// of shape `sample_shape`: element j of sample i is kept (1) when a 32-bit hash of (keys[i], j)
// falls below keep * 2^24, else 0. The hash is exact integer arithmetic, so every device draws
// the same bits: on the CPU by a loop, elsewhere (`tensor_ops`, or a non-CPU `options`) by a few
// tensor operations on the device itself, with nothing copied from the host but the keys. A
// sample of 2^32 elements or more is an Error.
at::Tensor keyed_keep_mask(const std::vector<uint64_t>& keys, at::IntArrayRef sample_shape, double keep,
                           const at::TensorOptions& options, bool tensor_ops = false);

// Inverted dropout whose mask for sample i is keyed by (seed, step, stream, global sample index)
// of the current RNG context (keyed_keep_mask), drawn on the input's device.
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

// Batch normalisation over dim 1 of [N, C] or [N, C, ...] input whose running statistics are
// deferred to the end of the step. A training forward normalises with the statistics of the
// batch it is given (in a pipeline, the micro-batch), as torch's BatchNorm does, but leaves the
// running statistics alone: it adds the batch's per-channel count, mean and sum of squared
// deviations to an accumulator (not while recomputing, common/recompute.h). commit() folds all
// of it into running_mean and running_var as one torch BatchNorm forward over the union would
// (momentum, unbiased variance) and counts one batch, so committing once per step makes the
// update independent of how the step's batch was split. (What a BatchNorm behind another one
// sees still depends on the split: the first normalises each micro-batch by its own
// statistics.) An evaluation forward uses the running statistics.
// Parameters and buffers have torch's names (weight, bias, running_mean, running_var,
// num_batches_tracked).
class BatchNormImpl : public torch::nn::Cloneable<BatchNormImpl> {
 public:
  explicit BatchNormImpl(int64_t features, double momentum = 0.1, double eps = 1e-5);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

  // Folds the accumulated statistics into the running ones; nothing happens if none were
  // accumulated since the last commit or reset.
  void commit();
  // Discards the accumulated statistics (a step that failed).
  void reset_accumulators();
  // Values per channel accumulated since the last commit (samples times spatial positions).
  int64_t pending_count() const { return count_; }
  // The accumulated statistics (count, per-channel mean and sum of squared deviations, float64;
  // undefined tensors when the count is 0), and their replacement: e.g. merged with another
  // copy's, so that the commit covers a batch split between data-parallel copies.
  std::tuple<int64_t, torch::Tensor, torch::Tensor> accumulated() const { return {count_, acc_mean_, acc_m2_}; }
  void set_accumulated(int64_t count, torch::Tensor mean, torch::Tensor m2);

  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  void accumulate(const torch::Tensor& x);

  int64_t features_;
  double momentum_, eps_;
  int64_t count_ = 0;
  torch::Tensor acc_mean_, acc_m2_;  // per channel, float64: mean and sum of squared deviations
};
TORCH_MODULE(BatchNorm);

// Every BatchNorm in `module` (itself included) commits, or discards, its accumulated statistics.
void commit_batch_norm(torch::nn::Module& module);
// Every BatchNorm in `module` (itself included), in module order.
std::vector<BatchNormImpl*> batch_norms(torch::nn::Module& module);
void reset_batch_norm(torch::nn::Module& module);

// Conv2d 3x3 (same padding), optional BatchNorm (then the conv has no bias), ReLU, then an
// optional 2x2 max-pool.
class ConvBlockImpl : public torch::nn::Cloneable<ConvBlockImpl> {
 public:
  ConvBlockImpl(int64_t in, int64_t out, bool pool, bool batch_norm = false);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int64_t in_, out_;
  bool pool_, batch_norm_;
  torch::nn::Conv2d conv_{nullptr};
  BatchNorm bn_{nullptr};
};
TORCH_MODULE(ConvBlock);

// Token embedding + learned position embedding + dropout.
class EmbeddingImpl : public torch::nn::Cloneable<EmbeddingImpl> {
 public:
  EmbeddingImpl(int64_t vocab, int64_t seq_len, int64_t d_model, double dropout, uint64_t stream);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& tokens) { return forward_at(tokens, 0); }
  // The tokens at positions offset .. offset + T - 1 (generation's next positions).
  torch::Tensor forward_at(const torch::Tensor& tokens, int64_t offset);

 private:
  int64_t vocab_, seq_len_, d_model_;
  double dropout_p_;
  uint64_t stream_;
  torch::nn::Embedding tok_{nullptr}, pos_{nullptr};
  Dropout dropout_{nullptr};
};
TORCH_MODULE(Embedding);

// Pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)); self-attention causal
// (each position sees itself and those before it) unless `causal` is false.
class BlockImpl : public torch::nn::Cloneable<BlockImpl> {
 public:
  BlockImpl(int64_t d_model, int64_t n_heads, int64_t d_ff, double dropout, uint64_t stream, bool causal = true);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int64_t d_model_, n_heads_, d_ff_;
  double dropout_p_;
  uint64_t stream_;
  bool causal_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr}, fc1_{nullptr}, fc2_{nullptr};
  Dropout attn_drop_{nullptr}, resid_drop_{nullptr}, mlp_drop_{nullptr};
};
TORCH_MODULE(Block);

// Pre-norm residual MLP over the last dimension: x + dropout(fc2(gelu(fc1(ln(x))))).
class MlpBlockImpl : public torch::nn::Cloneable<MlpBlockImpl> {
 public:
  MlpBlockImpl(int64_t d_model, int64_t d_ff, double dropout, uint64_t stream);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int64_t d_model_, d_ff_;
  double dropout_p_;
  uint64_t stream_;
  torch::nn::LayerNorm ln_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
  Dropout drop_{nullptr};
};
TORCH_MODULE(MlpBlock);

// Where an RMSNorm applies its learned scale, as each family of transformers' models does:
// Llama's after the cast back to the input's type; OLMo 2's before it (in float32 for lower
// precisions); Gemma's (1 + weight) before it, its weight zeros at the start.
enum class RmsScale { AfterCast, BeforeCast, OnePlus, None };  // None: no weight (OLMo's LayerNorm without parameters)

// RMS normalization over the trailing dimensions `shape`, with a learned scale ("weight", ones
// at the start but for RmsScale::OnePlus), as torch.nn.RMSNorm and transformers' RMSNorms:
// computed in float32 for lower precisions. With `center`, the mean is subtracted first: a
// LayerNorm without a bias (Cohere's). RmsScale::None (with `center`): no weight, torch's LayerNorm
// without parameters computed in float32 for lower precisions (OLMo's).
class RmsNormImpl : public torch::nn::Cloneable<RmsNormImpl> {
 public:
  // Over the last norm_dims of shape (0: all of it); the leading ones are the weight's own rows
  // (Command R+'s q/k norms: a weight [heads, head_dim], each head normalized over its values).
  // With `bias` (and `center`): torch's LayerNorm, a weight and a bias, as torch computes it
  // (StarCoder2's), whatever `scale`; with `torch_norm` (and `center`), torch's LayerNorm with a
  // bias or not, each row of a weight [rows, n] normalizing its own [..., rows, n] (StableLM's heads).
  RmsNormImpl(std::vector<int64_t> shape, double eps, RmsScale scale = RmsScale::AfterCast, bool center = false, size_t norm_dims = 0,
              bool bias = false, bool torch_norm = false);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  torch::Tensor bias;  ///< with `bias` only

 private:
  std::vector<int64_t> shape_;
  double eps_;
  RmsScale scale_;
  bool center_;
  size_t norm_dims_;
  bool has_bias_;
  bool torch_;  // torch's LayerNorm (with a bias or not)
};
TORCH_MODULE(RmsNorm);

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
