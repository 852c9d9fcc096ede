// The plain single-device loop (train/single_device.h).
#include "train/single_device.h"

#include "common/rng.h"
#include "models/layers.h"
#include "stages/autocast.h"

namespace pipetrain::train {

SingleDevice::SingleDevice(torch::nn::Sequential model, stages::LossFn loss, pipeline::OptimizerFactory optimizer,
                           uint64_t seed, Precision precision)
    : model_(std::move(model)), loss_(std::move(loss)), optimizer_(optimizer(model_->parameters())), seed_(seed),
      precision_(precision) {}

double SingleDevice::train_step(const at::Tensor& input, const at::Tensor& target) {
  optimizer_->zero_grad();
  RngContextGuard rng(RngContext{seed_, step_++, 0});
  at::Tensor loss;
  {
    stages::AutocastGuard autocast(precision_, input.device().type());
    loss = loss_(model_->forward(input), target);
    if (c10::isReducedFloatingType(loss.scalar_type())) loss = loss.to(at::kFloat);
  }
  models::commit_batch_norm(*model_);  // the whole batch in one forward, as torch's BatchNorm
  loss.backward();
  optimizer_->step();
  stages::clear_autocast_cache();  // the weights just changed
  return loss.item<double>();
}

}  // namespace pipetrain::train
