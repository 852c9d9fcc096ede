// The plain single-device loop (job/single_device.h).
#include "job/single_device.h"

#include <unordered_set>

#include "common/rng.h"
#include "models/layers.h"
#include "models/skip.h"
#include "stages/autocast.h"

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
  for (const auto& p : model_->parameters())
    if (!followers.count(p.unsafeGetTensorImpl())) stepped.push_back(p);
  optimizer_ = optimizer(stepped);
}

double SingleDevice::train_step(const at::Tensor& input, const at::Tensor& target) {
  for (auto& p : model_->parameters()) p.mutable_grad() = at::Tensor();
  RngContextGuard rng(RngContext{seed_, step_++, 0});
  at::Tensor loss;
  {
    stages::AutocastGuard autocast(precision_, input.device().type());
    loss = loss_(models::forward_with_skips(model_, input), target);
    if (c10::isReducedFloatingType(loss.scalar_type())) loss = loss.to(at::kFloat);
  }
  models::commit_batch_norm(*model_);  // the whole batch in one forward, as torch's BatchNorm
  loss.backward();
  torch::NoGradGuard no_grad;
  for (auto& members : ties_)  // one weight: the sum of its uses' gradients, in member order
    for (size_t i = 1; i < members.size(); ++i)
      if (members[i].grad().defined()) {
        if (members[0].grad().defined())
          members[0].mutable_grad().add_(members[i].grad());
        else
          members[0].mutable_grad() = members[i].grad().clone();
      }
  optimizer_->step();
  for (auto& members : ties_)
    for (size_t i = 1; i < members.size(); ++i) members[i].copy_(members[0]);
  stages::clear_autocast_cache();  // the weights just changed
  return loss.item<double>();
}

}  // namespace pipetrain::job
