// Weight gradients of linear layers deferred to the end of a step.
//
// A pipeline step runs each layer on M micro-batches, and each micro-batch's backward adds its
// weight gradient into .grad: a read and a write of the whole gradient per micro-batch and layer,
// on top of reading the weight for the input gradient. On a CPU, where a layer's weight and
// gradient do not stay in cache between micro-batches, that traffic is most of what a step of
// small micro-batches costs over one of the whole batch. With a stash in place on the calling
// thread (DeferWeightGrads), a linear layer's backward (models/linear.cpp) keeps the micro-batch's
// output gradient and input instead, and flush() computes each weight's gradient once, as one GEMM
// over every micro-batch's rows (what the plain loop computes on the whole batch), into .grad.
// The price is memory: each linear layer's input and output gradient of every micro-batch stay
// alive until the flush.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>

namespace pipetrain::models {

class WeightGradStash {
 public:
  /// Only weights of at least `min_bytes` are deferred: a smaller one (with its gradient) stays in
  /// cache between micro-batches, so deferring it saves no traffic and only lengthens the flush.
  explicit WeightGradStash(int64_t min_bytes = 0) : min_bytes_(min_bytes) {}
  /// Whether `weight`'s gradient is deferred (its size against min_bytes).
  bool takes(const at::Tensor& weight) const { return static_cast<int64_t>(weight.nbytes()) >= min_bytes_; }
  /// Keeps one micro-batch's `grad_output` [rows, out] and `input` [rows, in] of `weight` [out, in].
  void add(const at::Tensor& weight, at::Tensor grad_output, at::Tensor input);
  /// Every stashed weight's gradient, gradᵀ·input over all its rows, added into its .grad (set
  /// where it has none), in the order the weights were first stashed; then empty.
  void flush();
  void clear();
  bool empty() const { return entries_.empty(); }
  /// Bytes of the tensors held.
  int64_t bytes() const;

 private:
  struct Entry {
    at::Tensor weight;
    std::vector<at::Tensor> grad_outputs, inputs;
  };
  std::vector<Entry> entries_;
  std::unordered_map<const void*, size_t> index_;  // weight's TensorImpl -> entry
  int64_t min_bytes_;
};

/// The stash the calling thread's linear backwards keep their weight gradients in; null: none
/// (each backward adds its own).
WeightGradStash* current_weight_grad_stash();

/// Sets the calling thread's stash (null: none) for its lifetime, restoring the previous one.
class DeferWeightGrads {
 public:
  explicit DeferWeightGrads(WeightGradStash* stash);
  ~DeferWeightGrads();
  DeferWeightGrads(const DeferWeightGrads&) = delete;
  DeferWeightGrads& operator=(const DeferWeightGrads&) = delete;

 private:
  WeightGradStash* previous_;
};

}  // namespace pipetrain::models
