// The plain single-device loop (job/single_device.h).
#include "job/single_device.h"

#include <unordered_set>

#include <ATen/Parallel.h>

#include "common/error.h"
#include "common/rng.h"
#include "models/layers.h"
#include "models/skip.h"
#include "stages/autocast.h"
#include "models/model.h"

namespace pipetrain::job {

SingleDevice::SingleDevice(torch::nn::Sequential model, stages::LossFn loss, pipeline::OptimizerFactory optimizer,
                           uint64_t seed, Precision precision, std::vector<models::Tie> ties)
    : model_(std::move(model)), loss_(std::move(loss)), seed_(seed), precision_(precision) {
  std::unordered_set<const c10::TensorImpl*> followers;
  for (const models::Tie& tie : ties) {
    std::vector<at::Tensor> members;
    for (const models::ParamRef& ref : tie) members.push_back(model_->ptr(ref.layer)->named_parameters()[ref.name]);
    for (size_t i = 1; i < members.size(); ++i) followers.insert(members[i].unsafeGetTensorImpl());
    ties_.push_back(std::move(members));
  }
  std::vector<at::Tensor> stepped;
  for (const auto& p : models::trainable_parameters(*model_))
    if (!followers.count(p.unsafeGetTensorImpl())) stepped.push_back(p);
  if (optimizer) optimizer_ = optimizer(stepped);
}

double SingleDevice::forward_backward(const at::Tensor& input, const at::Tensor& target) {
  for (auto& p : model_->parameters()) p.mutable_grad() = at::Tensor();
  const Accumulation& a = accumulation_;
  const int threads = at::get_num_threads();
  if (a.intra_op_threads > 0) at::set_num_threads(a.intra_op_threads);
  const int64_t step = step_++;
  const auto xs = input.tensor_split(a.micro_batches, 0), ys = target.tensor_split(a.micro_batches, 0);
  const double N = static_cast<double>(input.size(0));
  double total = 0;
  int64_t offset = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i].size(0) == 0) continue;  // fewer samples than micro-batches, as the pipeline runs it
    at::Tensor loss;
    {
      // The pipeline's dropout streams: keyed by the seed, the step and the sample's place.
      RngContextGuard rng(RngContext{seed_, step, offset});
      stages::AutocastGuard autocast(precision_, input.device().type());
      loss = loss_(models::forward_with_skips(model_, xs[i]), ys[i]);
      if (c10::isReducedFloatingType(loss.scalar_type())) loss = loss.to(at::kFloat);
      // A micro-batch's share of the batch's mean loss; unsplit, the loss itself.
      if (xs.size() > 1) loss = loss * (static_cast<double>(xs[i].size(0)) / N);
      if (a.loss_scale != 1) loss = loss * a.loss_scale;
    }
    loss.backward();
    total += loss.item<double>() / a.loss_scale;
    offset += xs[i].size(0);
  }
  models::commit_batch_norm(*model_);  // the whole batch's statistics, as torch's BatchNorm
  if (a.intra_op_threads > 0) at::set_num_threads(threads);
  torch::NoGradGuard no_grad;
  for (auto& members : ties_) {  // one weight: the sum of its uses' gradients, in member order
    at::Tensor sum;
    for (const auto& m : members)
      if (m.grad().defined()) sum = sum.defined() ? sum + m.grad() : m.grad().clone();
    if (sum.defined())
      for (auto& m : members) m.mutable_grad() = sum.clone();
  }
  stages::clear_autocast_cache();  // the weights change before the next forward
  return total;
}

double SingleDevice::train_step(const at::Tensor& input, const at::Tensor& target) {
  const double loss = forward_backward(input, target);
  if (!optimizer_) throw InternalError("SingleDevice::train_step without an optimizer");
  torch::NoGradGuard no_grad;
  optimizer_->step();
  for (auto& members : ties_)
    for (size_t i = 1; i < members.size(); ++i) members[i].copy_(members[0]);
  return loss;
}

}  // namespace pipetrain::job
