#include "job/cross_entropy.h"

#include <algorithm>

#include <torch/torch.h>

#include "common/error.h"

namespace pipetrain::job {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::ScalarType wide(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

int64_t rows_per_chunk(int64_t classes, int64_t chunk_bytes) {
  return std::max<int64_t>(1, chunk_bytes / (classes * 8));
}

class ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& target, int64_t chunk_bytes) {
    const int64_t C = logits.size(-1);
    const at::Tensor x = logits.reshape({-1, C}), t = target.reshape({-1, 1});
    const int64_t N = x.size(0), step = rows_per_chunk(C, chunk_bytes);
    PIPETRAIN_CHECK(t.size(0) == N && N > 0);
    at::Tensor lse = torch::empty({N}, x.options().dtype(wide(x.scalar_type())));
    at::Tensor total = torch::zeros({}, lse.options());
    for (int64_t r = 0; r < N; r += step) {
      const int64_t n = std::min(step, N - r);
      const at::Tensor rows = x.narrow(0, r, n).to(lse.scalar_type());
      const at::Tensor l = torch::logsumexp(rows, 1);
      lse.narrow(0, r, n).copy_(l);
      total += (l - rows.gather(1, t.narrow(0, r, n)).squeeze(1)).sum();
    }
    ctx->save_for_backward({logits, target, lse});
    ctx->saved_data["chunk_bytes"] = chunk_bytes;
    return total / static_cast<double>(N);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& logits = saved[0];
    const int64_t C = logits.size(-1);
    const at::Tensor x = logits.reshape({-1, C}), t = saved[1].reshape({-1, 1}), lse = saved[2];
    const int64_t N = x.size(0), step = rows_per_chunk(C, ctx->saved_data["chunk_bytes"].toInt());
    const at::Tensor g = grad_out[0].to(lse.scalar_type()) / static_cast<double>(N);
    at::Tensor grad = torch::empty_like(x);
    for (int64_t r = 0; r < N; r += step) {
      const int64_t n = std::min(step, N - r);
      at::Tensor p = (x.narrow(0, r, n).to(lse.scalar_type()) - lse.narrow(0, r, n).unsqueeze(1)).exp_();
      p.scatter_add_(1, t.narrow(0, r, n), torch::full({n, 1}, -1.0, p.options()));
      grad.narrow(0, r, n).copy_(p.mul_(g));
    }
    return {grad.view(logits.sizes()), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor chunked_cross_entropy(const at::Tensor& logits, const at::Tensor& target, int64_t chunk_bytes) {
  return ChunkedCrossEntropy::apply(logits, target, chunk_bytes);
}

}  // namespace pipetrain::job
