// The plain single-device training loop the pipeline is compared against (bench, and every test
// that holds a pipeline to one device): the whole batch in one forward and backward, with the
// same dropout streams as the pipeline, and the forward under the same autocast as a pipeline
// stage's in a reduced precision. Optionally micro-batch by micro-batch as a pipeline splits the
// batch: the reference a reduced precision is held to, where only the order in which the
// micro-batches' gradients are summed may differ.
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
  struct Accumulation {
    int micro_batches = 1;      ///< the batch split as a pipeline splits it, gradients summed
    double loss_scale = 1;      ///< fp16: the loss multiplied before the backward; gradients come out scaled
    int intra_op_threads = 0;   ///< during the forward and backward (1: as a stage's worker); 0: as set
  };

  // `ties`: parameters that are one weight (models::Tie): their gradients are summed (every
  // member holds the sum), the optimizer steps the first member, the others copy it after each
  // step. `optimizer` may be empty: forward_backward only.
  SingleDevice(torch::nn::Sequential model, stages::LossFn loss, pipeline::OptimizerFactory optimizer, uint64_t seed,
               Precision precision = Precision::FP32, std::vector<models::Tie> ties = {});
  void accumulate(const Accumulation& a) { accumulation_ = a; }
  // One step's loss, and its gradients in the parameters' .grad (scaled by the loss scale), no update.
  double forward_backward(const at::Tensor& input, const at::Tensor& target);
  // forward_backward, then the optimizer's update.
  double train_step(const at::Tensor& input, const at::Tensor& target);
  std::vector<at::Tensor> parameters() const { return model_->parameters(); }

 private:
  torch::nn::Sequential model_;
  stages::LossFn loss_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  uint64_t seed_;
  Precision precision_;
  std::vector<std::vector<at::Tensor>> ties_;  // each tie's members, the first one stepped
  Accumulation accumulation_;
  int64_t step_ = 0;
};

}  // namespace pipetrain::job
