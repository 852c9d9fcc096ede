#include "models/layers.h"

#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "common/recompute.h"
#include "common/rng.h"

namespace pipetrain::models {

namespace F = torch::nn::functional;

namespace {
// A linear layer through libtorch's own linear op. torch::nn::Linear multiplies by a transposed
// view of the weight, which autocast casts afresh for every call (it caches only whole leaf
// tensors); through linear(), each weight is cast once per step and thread and that copy is
// shared by every micro-batch's graph, instead of one copy per micro-batch held for backward.
at::Tensor run_linear(const torch::nn::Linear& l, const at::Tensor& x) { return torch::linear(x, l->weight, l->bias); }
}  // namespace

torch::Tensor DropoutImpl::forward(const torch::Tensor& x) {
  if (!is_training() || p_ <= 0.0) return x;
  const RngContext& ctx = current_rng_context();
  // Drawn in float32 for a reduced-precision x, so the mask does not depend on the precision.
  const bool reduced = c10::isReducedFloatingType(x.scalar_type());
  auto mask = torch::empty(x.sizes(), x.options().device(torch::kCPU).dtype(reduced ? torch::kFloat : x.scalar_type()));
  for (int64_t i = 0; i < x.size(0); ++i) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(
        rng_key(ctx.seed, ctx.step, stream_, ctx.sample_offset + i));
    mask.select(0, i).bernoulli_(1.0 - p_, gen);
  }
  return x * mask.to(x.device(), x.scalar_type()) * (1.0 / (1.0 - p_));
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
  auto h = run_linear(linear_, flatten_ && x.dim() > 2 ? x.flatten(1) : x);
  if (relu_) h = torch::relu(h);
  if (dropout_) h = dropout_(h);
  return h;
}

BatchNormImpl::BatchNormImpl(int64_t features, double momentum, double eps)
    : features_(features), momentum_(momentum), eps_(eps) {
  TORCH_CHECK(features > 0, "BatchNorm: features must be positive, got ", features);
  TORCH_CHECK(momentum >= 0 && momentum <= 1, "BatchNorm: momentum must lie in [0, 1], got ", momentum);
  TORCH_CHECK(eps > 0, "BatchNorm: eps must be positive, got ", eps);
  reset();
}

void BatchNormImpl::reset() {
  weight = register_parameter("weight", torch::ones({features_}));
  bias = register_parameter("bias", torch::zeros({features_}));
  running_mean = register_buffer("running_mean", torch::zeros({features_}));
  running_var = register_buffer("running_var", torch::ones({features_}));
  num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
  reset_accumulators();  // a clone starts with none
}

torch::Tensor BatchNormImpl::forward(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() >= 2 && x.size(1) == features_, "BatchNorm(", features_, ") expects [N, ", features_,
              ", ...] input, got ", x.sizes());
  const bool cudnn = at::globalContext().userEnabledCuDNN();
  if (!is_training())
    return torch::batch_norm(x, weight, bias, running_mean, running_var, /*training=*/false, momentum_, eps_, cudnn);
  // One value per channel normalises to the bias whatever the input, and its variance is undefined.
  TORCH_CHECK(x.numel() / features_ > 1, "BatchNorm: expected more than 1 value per channel when training, got input ",
              x.sizes(), " (a batch or micro-batch of one sample; use fewer micro-batches)");
  if (!recomputing()) accumulate(x);
  return torch::batch_norm(x, weight, bias, /*running_mean=*/{}, /*running_var=*/{}, /*training=*/true, momentum_,
                           eps_, cudnn);
}

void BatchNormImpl::accumulate(const torch::Tensor& x) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  const int64_t n = x.numel() / features_;
  // Statistics of a reduced-precision (autocast) input are taken in float32.
  const at::Tensor v = c10::isReducedFloatingType(x.scalar_type()) ? x.detach().to(torch::kFloat) : x.detach();
  auto [var, mean] = torch::var_mean(v, dims, /*unbiased=*/false);
  mean = mean.to(torch::kDouble);
  at::Tensor m2 = var.to(torch::kDouble) * static_cast<double>(n);
  if (count_ == 0) {
    acc_mean_ = mean;
    acc_m2_ = m2;
    count_ = n;
    return;
  }
  // Merging two groups' means and squared deviations (Chan, Golub, LeVeque) stays exact where
  // a sum of squares minus the squared sum would cancel.
  const double a = static_cast<double>(count_), b = static_cast<double>(n);
  at::Tensor delta = mean - acc_mean_;
  acc_mean_ = acc_mean_ + delta * (b / (a + b));
  acc_m2_ = acc_m2_ + m2 + delta * delta * (a * b / (a + b));
  count_ += n;
}

void BatchNormImpl::commit() {
  if (count_ == 0) return;
  torch::NoGradGuard no_grad;
  const auto options = running_mean.options();
  running_mean.mul_(1 - momentum_).add_(acc_mean_.to(options), momentum_);
  running_var.mul_(1 - momentum_).add_((acc_m2_ / static_cast<double>(count_ - 1)).to(options), momentum_);
  num_batches_tracked.add_(1);
  reset_accumulators();
}

void BatchNormImpl::set_accumulated(int64_t count, torch::Tensor mean, torch::Tensor m2) {
  count_ = count;
  acc_mean_ = count ? std::move(mean) : torch::Tensor();
  acc_m2_ = count ? std::move(m2) : torch::Tensor();
}

void BatchNormImpl::reset_accumulators() {
  count_ = 0;
  acc_mean_ = at::Tensor();
  acc_m2_ = at::Tensor();
}

namespace {
template <typename F>
void for_each_batch_norm(torch::nn::Module& module, F f) {
  if (auto* bn = dynamic_cast<BatchNormImpl*>(&module)) f(*bn);
  for (const auto& m : module.modules(/*include_self=*/false))
    if (auto* bn = dynamic_cast<BatchNormImpl*>(m.get())) f(*bn);
}
}  // namespace

std::vector<BatchNormImpl*> batch_norms(torch::nn::Module& module) {
  std::vector<BatchNormImpl*> out;
  for_each_batch_norm(module, [&out](BatchNormImpl& bn) { out.push_back(&bn); });
  return out;
}

void commit_batch_norm(torch::nn::Module& module) {
  for_each_batch_norm(module, [](BatchNormImpl& bn) { bn.commit(); });
}

void reset_batch_norm(torch::nn::Module& module) {
  for_each_batch_norm(module, [](BatchNormImpl& bn) { bn.reset_accumulators(); });
}

ConvBlockImpl::ConvBlockImpl(int64_t in, int64_t out, bool pool, bool batch_norm)
    : in_(in), out_(out), pool_(pool), batch_norm_(batch_norm) {
  reset();
}

void ConvBlockImpl::reset() {
  // BatchNorm subtracts the channel mean, which cancels a conv bias.
  conv_ = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_, out_, 3).padding(1).bias(!batch_norm_)));
  if (batch_norm_) bn_ = register_module("bn", BatchNorm(out_));
}

torch::Tensor ConvBlockImpl::forward(const torch::Tensor& x) {
  auto h = conv_(x);
  if (bn_) h = bn_(h);
  h = torch::relu(h);
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
  auto h = tok_(tokens) + pos_(pos).unsqueeze(0);
  // Under autocast the residual stream is kept in the autocast dtype (an embedding lookup is not
  // autocast, and the blocks' residual additions would otherwise promote it back to float32), as
  // with low-precision weights: the blocks' activations, and what crosses a stage boundary, are
  // then in that dtype.
  const auto device = h.device().type();
  if (h.scalar_type() == torch::kFloat && at::autocast::is_autocast_enabled(device))
    h = h.to(at::autocast::get_autocast_dtype(device));
  return dropout_(h);
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
  auto qkv = run_linear(qkv_, ln1_(x)).view({B, T, 3, H, D}).permute({2, 0, 3, 1, 4});  // [3, B, H, T, D]
  auto q = qkv[0], k = qkv[1], v = qkv[2];
  auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(D)));
  auto future = torch::ones({T, T}, x.options().dtype(torch::kBool)).triu(1);
  att = attn_drop_(torch::softmax(att.masked_fill(future, -INFINITY), -1));
  auto y = torch::matmul(att, v).transpose(1, 2).reshape({B, T, C});
  auto h = x + resid_drop_(run_linear(proj_, y));
  return h + mlp_drop_(run_linear(fc2_, F::gelu(run_linear(fc1_, ln2_(h)))));
}

NormImpl::NormImpl(int64_t d_model) : d_model_(d_model) { reset(); }

void NormImpl::reset() {
  ln_ = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model_})));
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) { return ln_(x); }

}  // namespace pipetrain::models
