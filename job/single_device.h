// The plain single-device training loop the pipeline is compared against (bench, tests): the
// whole batch in one forward and backward, with the same dropout streams as the pipeline, and
// the forward under the same autocast as a pipeline stage's in a reduced precision.
#pragma once

#include <memory>

#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>

#include "common/precision.h"
#include "models/model.h"
#include "pipeline/pipeline.h"
#include "stages/stage.h"

namespace pipetrain::job {

class SingleDevice {
 public:
  // `ties`: parameters that are one weight (models::Tie): their gradients are summed into the
  // first member, which alone the optimizer steps, and the others copy it after each step.
  SingleDevice(torch::nn::Sequential model, stages::LossFn loss, pipeline::OptimizerFactory optimizer, uint64_t seed,
               Precision precision = Precision::FP32, std::vector<models::Tie> ties = {});
  double train_step(const at::Tensor& input, const at::Tensor& target);
  std::vector<at::Tensor> parameters() const { return model_->parameters(); }

 private:
  torch::nn::Sequential model_;
  stages::LossFn loss_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  uint64_t seed_;
  Precision precision_;
  std::vector<std::vector<at::Tensor>> ties_;  // each tie's members, the first one stepped
  int64_t step_ = 0;
};

}  // namespace pipetrain::job
