#include "models/layers.h"

#include <cmath>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "common/error.h"
#include "common/replayable.h"
#include "common/recompute.h"
#include "common/rng.h"
#include "models/decoder.h"
#include "models/max_pool.h"

namespace pipetrain::models {

namespace F = torch::nn::functional;

namespace {
// A linear layer through libtorch's own linear op. torch::nn::Linear multiplies by a transposed
// view of the weight, which autocast casts afresh for every call (it caches only whole leaf
// tensors); through linear(), each weight is cast once per step and thread and that copy is
// shared by every micro-batch's graph, instead of one copy per micro-batch held for backward.
// Without autocast, models::linear adds each micro-batch's weight gradient inside its GEMM.
at::Tensor run_linear(const torch::nn::Linear& l, const at::Tensor& x) { return linear(x, l->weight, l->bias); }
}  // namespace

namespace {
// lowbias32 (a 32-bit integer finalizer: two xor-shift-multiply rounds).
constexpr uint32_t kMul1 = 0x7feb352dU, kMul2 = 0x846ca68bU;
inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= kMul1;
  x ^= x >> 15;
  x *= kMul2;
  return x ^ (x >> 16);
}
inline uint32_t element_hash(uint32_t s1, uint32_t s2, uint32_t j) { return mix32(mix32(j ^ s1) ^ s2); }

// The same functions on int64 tensors holding values below 2^32: products split so that nothing
// exceeds 2^49 (int64 arithmetic never overflows), then taken mod 2^32.
constexpr int64_t kLow32 = 0xffffffffLL;
at::Tensor mul32(const at::Tensor& x, uint32_t c) {
  const int64_t lo = c & 0xffffU, hi = c >> 16;
  return (x * lo + (x * hi).bitwise_and_(0xffff).bitwise_left_shift_(16)).bitwise_and_(kLow32);
}
at::Tensor xorshift(const at::Tensor& x, int s) { return x.bitwise_xor(x.bitwise_right_shift(s)); }
at::Tensor mix32(const at::Tensor& x) {
  at::Tensor h = mul32(xorshift(x, 16), kMul1);
  h = mul32(xorshift(h, 15), kMul2);
  return xorshift(h, 16);
}
}  // namespace

at::Tensor keyed_keep_mask(const std::vector<uint64_t>& keys, at::IntArrayRef sample_shape, double keep,
                           const at::TensorOptions& options, bool tensor_ops) {
  int64_t n = 1;
  for (int64_t d : sample_shape) n *= d;
  if (n > static_cast<int64_t>(kLow32))
    throw Error(detail::concat("dropout: a sample of ", n, " elements; the keyed mask covers at most 2^32 - 1"));
  note_not_replayable("a random layer (dropout) draws its keyed masks from keys made on the host each step");
  const int64_t threshold = std::llround(std::min(1.0, std::max(0.0, keep)) * (1 << 24));
  const int64_t B = static_cast<int64_t>(keys.size());
  std::vector<int64_t> shape{B};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  if (!tensor_ops && options.device().is_cpu()) {
    at::Tensor mask = torch::empty({B, n}, options.dtype(at::kFloat));
    float* out = mask.data_ptr<float>();
    for (int64_t i = 0; i < B; ++i) {
      const auto s1 = static_cast<uint32_t>(keys[i]), s2 = static_cast<uint32_t>(keys[i] >> 32);
      for (int64_t j = 0; j < n; ++j)
        out[i * n + j] = (element_hash(s1, s2, static_cast<uint32_t>(j)) >> 8) < threshold ? 1.0f : 0.0f;
    }
    return mask.view(shape).to(options.dtype());
  }
  std::vector<int64_t> halves(2 * B);
  for (int64_t i = 0; i < B; ++i) {
    halves[2 * i] = static_cast<int64_t>(keys[i] & kLow32);
    halves[2 * i + 1] = static_cast<int64_t>(keys[i] >> 32);
  }
  const auto longs = options.dtype(at::kLong);
  // To a GPU from pinned memory, without waiting: the caching host allocator keeps the buffer
  // until the copy has run, so the host goes on queueing the step.
  at::Tensor host = torch::tensor(halves, at::TensorOptions().dtype(at::kLong)).view({B, 2});
  if (options.device().is_cuda()) host = host.pin_memory();
  const at::Tensor s = host.to(options.device(), /*non_blocking=*/true);
  const at::Tensor j = torch::arange(n, longs).view({1, n});
  at::Tensor h = mix32(j.bitwise_xor(s.select(1, 0).view({B, 1})));
  h = mix32(h.bitwise_xor(s.select(1, 1).view({B, 1})));
  return h.bitwise_right_shift(8).lt(threshold).view(shape).to(options.dtype());
}

torch::Tensor DropoutImpl::forward(const torch::Tensor& x) {
  if (!is_training() || p_ <= 0.0) return x;
  const RngContext& ctx = current_rng_context();
  std::vector<uint64_t> keys(static_cast<size_t>(x.size(0)));
  for (int64_t i = 0; i < x.size(0); ++i) keys[i] = rng_key(ctx.seed, ctx.step, stream_, ctx.sample_offset + i);
  // The mask is 0 or 1 in x's precision (exact), so it does not depend on the precision.
  const at::Tensor mask = keyed_keep_mask(keys, x.sizes().slice(1), 1.0 - p_, x.options());
  return x * mask * (1.0 / (1.0 - p_));
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
  // The batch statistics are merged on the host (count_): a replayed graph would not merge them.
  note_not_replayable("BatchNorm merges its batch statistics on the host each micro-batch");
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
  return pool_ ? max_pool2x2(h) : h;
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

torch::Tensor EmbeddingImpl::forward_at(const torch::Tensor& tokens, int64_t offset) {
  TORCH_CHECK(offset >= 0 && tokens.dim() == 2 && offset + tokens.size(1) <= seq_len_, "embedding expects [batch, <=",
              seq_len_ - offset, "] token ids at position ", offset, ", got ", tokens.sizes());
  auto pos = torch::arange(offset, offset + tokens.size(1), tokens.options().dtype(torch::kLong));
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

BlockImpl::BlockImpl(int64_t d_model, int64_t n_heads, int64_t d_ff, double dropout, uint64_t stream, bool causal)
    : d_model_(d_model), n_heads_(n_heads), d_ff_(d_ff), dropout_p_(dropout), stream_(stream), causal_(causal) {
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
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  // Fused attention (models/decoder.h); the explicit path, with its keyed masks, for attention
  // dropout in training.
  at::Tensor att;
  if (causal_) {
    att = causal_attention(q, k, v, scale, 0, attn_drop_.get());
  } else if (attn_drop_->is_training() && dropout_p_ > 0) {
    att = torch::matmul(attn_drop_(torch::softmax(torch::matmul(q, k.transpose(-2, -1)) * scale, -1)), v);
  } else {
    att = at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, scale);
  }
  auto y = att.transpose(1, 2).reshape({B, T, C});
  auto h = x + resid_drop_(run_linear(proj_, y));
  return h + mlp_drop_(run_linear(fc2_, F::gelu(run_linear(fc1_, ln2_(h)))));
}

MlpBlockImpl::MlpBlockImpl(int64_t d_model, int64_t d_ff, double dropout, uint64_t stream)
    : d_model_(d_model), d_ff_(d_ff), dropout_p_(dropout), stream_(stream) {
  reset();
}

void MlpBlockImpl::reset() {
  ln_ = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model_})));
  fc1_ = register_module("fc1", torch::nn::Linear(d_model_, d_ff_));
  fc2_ = register_module("fc2", torch::nn::Linear(d_ff_, d_model_));
  drop_ = register_module("dropout", Dropout(dropout_p_, stream_));
}

torch::Tensor MlpBlockImpl::forward(const torch::Tensor& x) {
  return x + drop_(run_linear(fc2_, F::gelu(run_linear(fc1_, ln_(x)))));
}

RmsNormImpl::RmsNormImpl(std::vector<int64_t> shape, double eps, RmsScale scale, bool center, size_t norm_dims, bool bias,
                         bool torch_norm)
    : shape_(std::move(shape)), eps_(eps), scale_(scale), center_(center), norm_dims_(norm_dims == 0 ? shape_.size() : norm_dims),
      has_bias_(bias), torch_(bias || torch_norm) {
  PIPETRAIN_CHECK(norm_dims_ <= shape_.size() && (!bias || (center && norm_dims_ == shape_.size())));
  PIPETRAIN_CHECK(!torch_ || (center && (norm_dims_ == shape_.size() || (shape_.size() == 2 && norm_dims_ == 1))));
  PIPETRAIN_CHECK(scale != RmsScale::None || (center && !bias && !torch_norm && norm_dims_ == shape_.size()));
  reset();
}

void RmsNormImpl::reset() {
  if (scale_ == RmsScale::None) return;  // no parameters
  weight = register_parameter("weight", scale_ == RmsScale::OnePlus ? torch::zeros(shape_) : torch::ones(shape_));
  if (has_bias_) bias = register_parameter("bias", torch::zeros(shape_));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  if (torch_ && norm_dims_ == shape_.size()) return at::layer_norm(x, shape_, weight, bias, eps_);  // torch's LayerNorm
  if (torch_) {  // each row of the weight its own LayerNorm over x's last dimension (StableLM's heads), as torch computes each
    std::vector<at::Tensor> rows;
    for (int64_t i = 0; i < shape_[0]; ++i) rows.push_back(at::layer_norm(x.select(-2, i), {shape_[1]}, weight[i], {}, eps_));
    return torch::stack(rows, -2);
  }
  // As transformers' RMSNorms: in float32 at least; the scale where the family applies it.
  const bool reduced = c10::isReducedFloatingType(x.scalar_type());
  if (scale_ == RmsScale::None) return at::layer_norm(reduced ? x.to(torch::kFloat) : x, shape_, {}, {}, eps_).to(x.scalar_type());
  std::vector<int64_t> dims;
  for (size_t i = 0; i < norm_dims_; ++i) dims.push_back(-1 - static_cast<int64_t>(i));
  const at::Tensor f = reduced ? x.to(torch::kFloat) : x;
  const at::Tensor h = center_ ? f - f.mean(dims, /*keepdim=*/true) : f;
  const at::Tensor normed = h * torch::rsqrt(h.pow(2).mean(dims, /*keepdim=*/true) + eps_);
  switch (scale_) {
    case RmsScale::AfterCast: return weight * normed.to(x.scalar_type());
    case RmsScale::BeforeCast: return (weight * normed).to(x.scalar_type());
    case RmsScale::OnePlus: return (normed * (1 + (reduced ? weight.to(torch::kFloat) : weight))).to(x.scalar_type());
  }
  PIPETRAIN_CHECK(false);
  return {};
}

NormImpl::NormImpl(int64_t d_model) : d_model_(d_model) { reset(); }

void NormImpl::reset() {
  ln_ = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model_})));
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) { return ln_(x); }

}  // namespace pipetrain::models
