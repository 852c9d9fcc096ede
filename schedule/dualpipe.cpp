// DualPipeV (schedule.h): the V-placed, cut-in-half form of DeepSeek's DualPipe.
#include <deque>
#include <utility>

#include "schedule/build.h"
#include "schedule/schedule.h"

namespace pipetrain::schedule {

Schedule make_dualpipev(int stages, int micro_batches) {
  check_supported(Kind::DualPipeV, stages, micro_batches, 2);
  const int K = stages, M = micro_batches;
  std::vector<std::vector<Unit>> order(K);
  for (int r = 0; r < K; ++r) {
    auto& o = order[r];
    int next_f[2] = {0, 0}, next_b[2] = {0, 0};
    std::deque<std::pair<int, int>> weights;  // split backwards whose W is still to run: (micro-batch, chunk)
    bool split = false;  // the drain splits backwards, and runs the Ws where the gradients leave gaps
    auto forward = [&](int c) { o.push_back({Op::Forward, next_f[c]++, c}); };
    auto backward = [&](int c) {
      const int m = next_b[c]++;
      if (!split) return o.push_back({Op::Backward, m, c});
      o.push_back({Op::BackwardInput, m, c});
      weights.emplace_back(m, c);
    };
    auto weight = [&] {
      o.push_back({Op::BackwardWeight, weights.front().first, weights.front().second});
      weights.pop_front();
    };
    // 1. Forwards of chunk 0 fill the time until chunk 1's first input comes back up the V.
    for (int i = 0; i < 2 * (K - r - 1); ++i) forward(0);
    // 2. Both chunks' forwards, in turn.
    for (int i = 0; i <= r; ++i) forward(0), forward(1);
    // 3. Chunk 1's first backwards, each with its W at once, between chunk 1 forwards.
    for (int i = 0; i < K - r - 1; ++i) {
      o.push_back({Op::BackwardInput, next_b[1], 1});
      o.push_back({Op::BackwardWeight, next_b[1]++, 1});
      forward(1);
    }
    // 4. The steady state: each forward paired with a backward of the other chunk.
    for (int i = 0; i < M - 2 * K + r + 1; ++i) {
      forward(0), backward(1);
      forward(1), backward(0);
    }
    // 5. Chunk 0's forwards are done; chunk 1's last forwards pair with chunk 0 backwards.
    for (int i = 0; i < K - r - 1; ++i) {
      backward(1);
      forward(1), backward(0);
    }
    // 6. Backwards of both chunks; halfway through, they start to split.
    const int step6 = r + 1;
    for (int i = 0; i < step6; ++i) {
      if (i == step6 / 2 && r % 2 == 1) split = true;
      backward(1);
      if (i == step6 / 2 && r % 2 == 0) split = true;
      backward(0);
    }
    // 7. The remaining chunk 0 backwards, each after a held-back W.
    for (int i = 0; i < K - r - 1; ++i) weight(), backward(0);
    // 8. The last Ws.
    while (!weights.empty()) weight();
  }
  return expand(Kind::DualPipeV, K, M, 2, Placement::V, order);
}

}  // namespace pipetrain::schedule
