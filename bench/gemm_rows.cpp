// How the BLAS behind libtorch handles the skinny matrix products of small micro-batches:
// times x[rows, 1024] @ W^T[1024, 1024] on one thread for several row counts. A per-call cost
// that depends only on W (packing and streaming the 4 MiB weight) makes small micro-batches
// slower per sample; see README.md, Benchmarks.
#include <chrono>
#include <cstdio>

#include <torch/torch.h>

int main() {
  at::set_num_threads(1);
  const auto w = torch::randn({1024, 1024});
  std::printf("%6s %10s %10s %16s\n", "rows", "ms/call", "GFLOP/s", "ms per 8 rows");
  for (int rows : {1, 8, 16, 32, 64, 128}) {
    const auto x = torch::randn({rows, 1024});
    for (int i = 0; i < 20; ++i) x.mm(w.t());
    const int calls = 400;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) x.mm(w.t());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
    std::printf("%6d %10.3f %10.1f %16.3f\n", rows, s * 1e3, 2.0 * rows * 1024 * 1024 / s / 1e9, s * 1e3 * 8 / rows);
  }
  return 0;
}
