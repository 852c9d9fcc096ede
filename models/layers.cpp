#include "models/layers.h"

#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "common/rng.h"

namespace pipetrain::models {

namespace F = torch::nn::functional;

torch::Tensor DropoutImpl::forward(const torch::Tensor& x) {
  if (!is_training() || p_ <= 0.0) return x;
  const RngContext& ctx = current_rng_context();
  auto mask = torch::empty(x.sizes(), x.options().device(torch::kCPU));
  for (int64_t i = 0; i < x.size(0); ++i) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(
        rng_key(ctx.seed, ctx.step, stream_, ctx.sample_offset + i));
    mask.select(0, i).bernoulli_(1.0 - p_, gen);
  }
  return x * mask.to(x.device()) * (1.0 / (1.0 - p_));
}

DenseImpl::DenseImpl(int64_t in, int64_t out, bool relu, double dropout, uint64_t stream, bool flatten)
    : in_(in), out_(out), relu_(relu), dropout_p_(dropout), flatten_(flatten), stream_(stream) {
  reset();
}

void DenseImpl::reset() {
  linear_ = register_module("linear", torch::nn::Linear(in_, out_));
  if (dropout_p_ > 0) dropout_ = register_module("dropout", Dropout(dropout_p_, stream_));
}

torch::Tensor DenseImpl::forward(const torch::Tensor& x) {
  auto h = linear_(flatten_ && x.dim() > 2 ? x.flatten(1) : x);
  if (relu_) h = torch::relu(h);
  if (dropout_) h = dropout_(h);
  return h;
}

ConvBlockImpl::ConvBlockImpl(int64_t in, int64_t out, bool pool) : in_(in), out_(out), pool_(pool) {
  reset();
}

void ConvBlockImpl::reset() {
  conv_ = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_, out_, 3).padding(1)));
}

torch::Tensor ConvBlockImpl::forward(const torch::Tensor& x) {
  auto h = torch::relu(conv_(x));
  return pool_ ? torch::max_pool2d(h, 2) : h;
}

EmbeddingImpl::EmbeddingImpl(int64_t vocab, int64_t seq_len, int64_t d_model, double dropout,
                             uint64_t stream)
    : vocab_(vocab), seq_len_(seq_len), d_model_(d_model), dropout_p_(dropout), stream_(stream) {
  reset();
}

void EmbeddingImpl::reset() {
  tok_ = register_module("tok", torch::nn::Embedding(vocab_, d_model_));
  pos_ = register_module("pos", torch::nn::Embedding(seq_len_, d_model_));
  dropout_ = register_module("dropout", Dropout(dropout_p_, stream_));
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& tokens) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(1) <= seq_len_, "embedding expects [batch, <=",
              seq_len_, "] token ids, got ", tokens.sizes());
  auto pos = torch::arange(tokens.size(1), tokens.options().dtype(torch::kLong));
  return dropout_(tok_(tokens) + pos_(pos).unsqueeze(0));
}

BlockImpl::BlockImpl(int64_t d_model, int64_t n_heads, int64_t d_ff, double dropout, uint64_t stream)
    : d_model_(d_model), n_heads_(n_heads), d_ff_(d_ff), dropout_p_(dropout), stream_(stream) {
  reset();
}

void BlockImpl::reset() {
  ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model_})));
  qkv_ = register_module("qkv", torch::nn::Linear(d_model_, 3 * d_model_));
  proj_ = register_module("proj", torch::nn::Linear(d_model_, d_model_));
  ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model_})));
  fc1_ = register_module("fc1", torch::nn::Linear(d_model_, d_ff_));
  fc2_ = register_module("fc2", torch::nn::Linear(d_ff_, d_model_));
  // Each dropout in a block has its own stream: stream_ is the block's first of three.
  attn_drop_ = register_module("attn_drop", Dropout(dropout_p_, stream_));
  resid_drop_ = register_module("resid_drop", Dropout(dropout_p_, stream_ + 1));
  mlp_drop_ = register_module("mlp_drop", Dropout(dropout_p_, stream_ + 2));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), H = n_heads_, D = C / H;
  auto qkv = qkv_(ln1_(x)).view({B, T, 3, H, D}).permute({2, 0, 3, 1, 4});  // [3, B, H, T, D]
  auto q = qkv[0], k = qkv[1], v = qkv[2];
  auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(D)));
  auto future = torch::ones({T, T}, x.options().dtype(torch::kBool)).triu(1);
  att = attn_drop_(torch::softmax(att.masked_fill(future, -INFINITY), -1));
  auto y = torch::matmul(att, v).transpose(1, 2).reshape({B, T, C});
  auto h = x + resid_drop_(proj_(y));
  return h + mlp_drop_(fc2_(F::gelu(fc1_(ln2_(h)))));
}

NormImpl::NormImpl(int64_t d_model) : d_model_(d_model) { reset(); }

void NormImpl::reset() {
  ln_ = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model_})));
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) { return ln_(x); }

}  // namespace pipetrain::models
