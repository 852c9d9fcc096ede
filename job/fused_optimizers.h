// SGD, Adam and AdamW whose step is one fused libtorch kernel per parameter group, device and
// dtype (at::_fused_sgd_, at::_fused_adam_, at::_fused_adamw_: a single pass over every
// parameter, gradient and state tensor), instead of libtorch's loop of a few elementwise kernels
// per parameter. They are libtorch's optimizers otherwise: the same options, the same state
// (SGDParamState, AdamParamState, AdamWParamState: checkpoints, the sharded optimizer's gather and
// pipeline/optimizer_state.h read it unchanged) and the same update up to rounding
// (FusedOptimizers.* in tests/engine_parts_test.cpp). Sparse gradients are refused, as the
// fused kernels take none. make_optimizer_factory (job.h) builds these.
#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace pipetrain::job {

class FusedSGD : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;
  at::Tensor step(LossClosure closure = nullptr) override;
};

class FusedAdam : public torch::optim::Adam {
 public:
  using torch::optim::Adam::Adam;
  at::Tensor step(LossClosure closure = nullptr) override;
};

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  at::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace pipetrain::job
