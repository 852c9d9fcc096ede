// Max pooling over 2 x 2 windows, stride 2 (max_pool.h).
#include "models/max_pool.h"

#include <cmath>
#include <cstdint>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

namespace pipetrain::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Planes of [H, W] (contiguous) -> planes of [H/2, W/2] maxima and the chosen element of each
// window (0..3, row-major), as libtorch's kernel chooses: a value replaces the maximum so far if
// it is greater or NaN, the window scanned row by row.
template <typename T>
void pool_planes(const T* in, T* out, uint8_t* which, int64_t planes, int64_t H, int64_t W) {
  using acc = at::opmath_type<T>;
  const int64_t OH = H / 2, OW = W / 2;
  at::parallel_for(0, planes, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      for (int64_t oh = 0; oh < OH; ++oh) {
        const T* r0 = in + (p * H + 2 * oh) * W;
        const T* r1 = r0 + W;
        T* o = out + (p * OH + oh) * OW;
        uint8_t* k = which + (p * OH + oh) * OW;
        for (int64_t ow = 0; ow < OW; ++ow) {
          const acc v[4] = {acc(r0[2 * ow]), acc(r0[2 * ow + 1]), acc(r1[2 * ow]), acc(r1[2 * ow + 1])};
          acc m = v[0];
          uint8_t j = 0;
          for (uint8_t i = 1; i < 4; ++i)
            if (v[i] > m || std::isnan(v[i])) m = v[i], j = i;
          o[ow] = T(m);
          k[ow] = j;
        }
      }
    }
  });
}

// The gradient of pool_planes: each window's output gradient to its chosen element, zero to the
// others (and to a last odd row or column, which no window covers).
template <typename T>
void unpool_planes(const T* grad_out, const uint8_t* which, T* grad_in, int64_t planes, int64_t H, int64_t W) {
  const int64_t OH = H / 2, OW = W / 2;
  at::parallel_for(0, planes, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      T* plane = grad_in + p * H * W;
      if (H % 2 != 0 || W % 2 != 0) std::fill(plane, plane + H * W, T(0));
      for (int64_t oh = 0; oh < OH; ++oh) {
        T* r[2] = {plane + 2 * oh * W, plane + (2 * oh + 1) * W};
        const T* g = grad_out + (p * OH + oh) * OW;
        const uint8_t* k = which + (p * OH + oh) * OW;
        for (int64_t ow = 0; ow < OW; ++ow) {
          r[0][2 * ow] = r[0][2 * ow + 1] = r[1][2 * ow] = r[1][2 * ow + 1] = T(0);
          r[k[ow] >> 1][2 * ow + (k[ow] & 1)] = T(0) + g[ow];  // added to zero, as libtorch does: -0 becomes +0
        }
      }
    }
  });
}

class MaxPool2x2 : public torch::autograd::Function<MaxPool2x2> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    const at::Tensor in = x.contiguous();
    const int64_t H = in.size(-2), W = in.size(-1), planes = in.numel() / (H * W);
    std::vector<int64_t> out_sizes = in.sizes().vec();
    out_sizes[out_sizes.size() - 2] = H / 2;
    out_sizes[out_sizes.size() - 1] = W / 2;
    at::Tensor out = at::empty(out_sizes, in.options());
    at::Tensor which = at::empty(out_sizes, in.options().dtype(at::kByte));
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, in.scalar_type(), "max_pool2x2", [&] {
      pool_planes(in.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), which.mutable_data_ptr<uint8_t>(),
                  planes, H, W);
    });
    ctx->save_for_backward({which});
    ctx->saved_data["sizes"] = in.sizes().vec();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const at::Tensor which = ctx->get_saved_variables()[0];
    const std::vector<int64_t> sizes = ctx->saved_data["sizes"].toIntVector();
    const int64_t H = sizes[sizes.size() - 2], W = sizes[sizes.size() - 1];
    const int64_t planes = c10::multiply_integers(sizes) / (H * W);
    if (at::GradMode::is_enabled()) {
      // A graph of this backward (create_graph): the same gradient by differentiable operations,
      // each window's output gradient added to zero at its chosen element's flat index.
      const int64_t OH = H / 2, OW = W / 2;
      const at::Tensor k = which.to(at::kLong).view({planes, OH, OW});
      const at::Tensor oh = at::arange(OH, k.options()).view({1, OH, 1}), ow = at::arange(OW, k.options()).view({1, 1, OW});
      const at::Tensor index = (2 * oh + at::floor_divide(k, 2)) * W + 2 * ow + at::remainder(k, 2);
      return {at::zeros({planes, H * W}, grad_out[0].options())
                  .scatter_add(1, index.view({planes, OH * OW}), grad_out[0].reshape({planes, OH * OW}))
                  .view(sizes)};
    }
    const at::Tensor g = grad_out[0].contiguous();
    at::Tensor grad_in = at::empty(sizes, g.options());
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, g.scalar_type(), "max_pool2x2_backward", [&] {
      unpool_planes(g.const_data_ptr<scalar_t>(), which.const_data_ptr<uint8_t>(), grad_in.mutable_data_ptr<scalar_t>(),
                    planes, H, W);
    });
    return {grad_in};
  }
};

}  // namespace

at::Tensor max_pool2x2(const at::Tensor& x) {
  const bool ours = x.device().is_cpu() && x.layout() == c10::kStrided && (x.dim() == 3 || x.dim() == 4) &&
                    x.is_contiguous() && x.size(-2) >= 2 && x.size(-1) >= 2 && x.numel() > 0 &&
                    (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble ||
                     x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf) &&
                    !x._fw_grad(/*level=*/0).defined();
  if (!ours) return torch::max_pool2d(x, 2);
  return MaxPool2x2::apply(x);
}

}  // namespace pipetrain::models
