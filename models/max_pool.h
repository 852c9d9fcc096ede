// Max pooling over 2 x 2 windows with stride 2, the CNN's and the U-Net's pool.
//
// libtorch's CPU kernel for a contiguous (NCHW) input runs a scalar loop per output with index
// bookkeeping; on the CNN config's first stage it took 30% of the step (1.5 ms for a 16 x 32 x
// 28 x 28 micro-batch, one thread, where a loop over the four values of each window takes a
// tenth of that). This is that loop, forward and backward, with libtorch's results bit for bit:
// the same maximum, NaN propagated, and the same element of a window chosen on a tie (the first
// in row-major order that is greater than those before it, or NaN), so the gradient goes where
// torch::max_pool2d sends it. Other devices, layouts and shapes run torch::max_pool2d.
#pragma once

#include <ATen/core/Tensor.h>

namespace pipetrain::models {

/// torch::max_pool2d(x, 2) for a [N, C, H, W] or [C, H, W] input (H and W floored to even, as
/// it does), with its gradient (built of differentiable operations when a graph of the backward
/// is asked for).
at::Tensor max_pool2x2(const at::Tensor& x);

}  // namespace pipetrain::models
