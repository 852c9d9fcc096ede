#include "planner/concurrency.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "common/error.h"
#include "common/stats.h"
#include "common/strings.h"
#include "job/job.h"
#include "job/single_device.h"

namespace pipetrain::planner {

namespace {

// Every worker waits here until all have arrived, once per repetition; a worker that failed
// releases the others (they then stop), so no wait outlasts the failure.
class StartLine {
 public:
  explicit StartLine(int n) : n_(n) {}
  bool arrive() {  // false: give up (another worker failed)
    std::unique_lock<std::mutex> lock(mu_);
    const int gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0, ++generation_;
      cv_.notify_all();
      return !failed_;
    }
    cv_.wait_for(lock, std::chrono::seconds(600), [&] { return generation_ != gen || failed_; });
    return generation_ != gen && !failed_;
  }
  void fail() {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, arrived_ = 0, generation_ = 0;
  bool failed_ = false;
};

using Clock = std::chrono::steady_clock;

}  // namespace

Concurrency measure_concurrency(const job::Config& config, Precision precision, int workers, int repeat) {
  PIPETRAIN_CHECK(workers >= 2 && repeat >= 1, "measure_concurrency: ", workers, " workers, ", repeat, " repeats");
  job::Config cc = job::with_precision(config, precision);
  cc.pipeline.stages = 1, cc.pipeline.chunks = 1, cc.pipeline.micro_batches = 1, cc.pipeline.data_parallel = 1;
  cc.pipeline.schedule = schedule::Kind::GPipe;
  cc.pipeline.balance_method = job::BalanceMethod::Uniform, cc.pipeline.balance.clear();
  cc.pipeline.speeds.clear(), cc.pipeline.memory_limit.clear();
  cc.runtime.intra_op_threads = 1;
  const int64_t batch = cc.data.batch_size;
  const int64_t rows = (batch + workers - 1) / workers;  // the workers may share samples: only time counts

  struct Copy {
    explicit Copy(job::Job j) : job(std::move(j)) {}
    job::Job job;
    std::unique_ptr<job::SingleDevice> step;
    at::Tensor x, y;
    std::vector<double> ms;
  };
  std::vector<std::unique_ptr<Copy>> copies;
  for (int i = 0; i < workers; ++i) {
    auto k = std::make_unique<Copy>(job::prepare(cc));
    job::Batch b = job::to_model(k->job, k->job.data.train_batch(0, batch, cc.train.seed));
    k->x = b.input.narrow(0, 0, std::min<int64_t>(rows, b.input.size(0)));
    k->y = b.target.narrow(0, 0, std::min<int64_t>(rows, b.target.size(0)));
    k->step = std::make_unique<job::SingleDevice>(k->job.model.layers, job::mean_cross_entropy,
                                                  pipeline::OptimizerFactory(), cc.train.seed, precision, k->job.model.ties);
    k->step->accumulate({1, 1, /*intra_op_threads=*/1});
    copies.push_back(std::move(k));
  }
  auto once = [](Copy& k) {
    const auto t0 = Clock::now();
    k.step->forward_backward(k.x, k.y);
    for (auto& p : k.step->parameters()) p.mutable_grad() = at::Tensor();
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };

  Concurrency out;
  out.workers = workers;
  {  // alone: worker 0, with the other cores idle
    std::vector<double> alone;
    std::exception_ptr error;
    std::thread t([&] {
      try {
        at::set_num_threads(1);
        once(*copies[0]);
        for (int r = 0; r < repeat; ++r) alone.push_back(once(*copies[0]));
      } catch (...) {
        error = std::current_exception();
      }
    });
    t.join();
    if (error) std::rethrow_exception(error);
    out.alone_ms = median(alone);
  }
  StartLine line(workers);
  std::vector<std::exception_ptr> errors(workers);
  std::vector<std::thread> threads;
  for (int i = 0; i < workers; ++i)
    threads.emplace_back([&, i] {
      try {
        at::set_num_threads(1);
        if (!line.arrive()) return;
        once(*copies[i]);  // warm-up, together
        for (int r = 0; r < repeat; ++r) {
          if (!line.arrive()) return;
          copies[i]->ms.push_back(once(*copies[i]));
        }
      } catch (...) {
        errors[i] = std::current_exception();
        line.fail();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  std::vector<double> all;
  double spread = 0;
  for (int r = 0; r < repeat; ++r) {
    double slowest = 0, sum = 0;
    for (const auto& k : copies) {
      if (static_cast<int>(k->ms.size()) <= r) throw InternalError("measure_concurrency: a worker stopped early");
      slowest = std::max(slowest, k->ms[r]), sum += k->ms[r];
      all.push_back(k->ms[r]);
    }
    spread += slowest - sum / workers;
  }
  out.together_ms = median(all);
  out.slowdown = out.alone_ms > 0 ? std::max(1.0, out.together_ms / out.alone_ms) : 1.0;
  out.straggler = out.together_ms > 0 ? spread / repeat / out.together_ms : 0.0;
  return out;
}

}  // namespace pipetrain::planner
