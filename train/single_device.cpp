// The plain single-device loop (train/single_device.h).
#include "train/single_device.h"

#include "common/rng.h"
#include "models/layers.h"

namespace pipetrain::train {

SingleDevice::SingleDevice(torch::nn::Sequential model, stages::LossFn loss, pipeline::OptimizerFactory optimizer,
                           uint64_t seed)
    : model_(std::move(model)), loss_(std::move(loss)), optimizer_(optimizer(model_->parameters())), seed_(seed) {}

double SingleDevice::train_step(const at::Tensor& input, const at::Tensor& target) {
  optimizer_->zero_grad();
  RngContextGuard rng(RngContext{seed_, step_++, 0});
  at::Tensor loss = loss_(model_->forward(input), target);
  models::commit_batch_norm(*model_);  // the whole batch in one forward, as torch's BatchNorm
  loss.backward();
  optimizer_->step();
  return loss.item<double>();
}

}  // namespace pipetrain::train
