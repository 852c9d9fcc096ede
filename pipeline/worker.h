// A long-lived thread that runs one job at a time: each stage of an in-process pipeline owns
// one, so libtorch's per-thread state (intra-op thread count, grad mode) persists across steps.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "stages/device.h"

namespace pipetrain::pipeline {

class Worker {
 public:
  // `memory_account`: the thread's common/memory_account.h (its device), -1 for none.
  // `context`: the stage's device context (stages/device.h), entered for every job and
  // synchronized at its end (once per step: the caller then sees what the job computed); null
  // for none. It must outlive the worker.
  //
  // `on_caller`: no thread of its own; submit() runs the job at once on the calling thread (with
  // the worker's intra-op count, memory account and context, the caller's restored after). For
  // a pipeline of one stage, which has nothing to overlap: libtorch's intra-op parallelism from
  // a second thread runs at half speed or worse once the calling thread has used several intra-op
  // threads itself (GNU OpenMP; measured: a GPT step on 2 threads in a worker 2x slower than on
  // the calling thread), so the plain loop's plan runs where the plain loop does.
  Worker(std::string name, int intra_op_threads, int memory_account = -1, stages::DeviceContext* context = nullptr,
         bool on_caller = false);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void submit(std::function<void()> job);
  // Waits for the submitted job; its exception, if any, is returned rather than thrown.
  std::exception_ptr wait();

 private:
  void loop();
  std::exception_ptr run(const std::function<void()>& job);

  std::string name_;
  int intra_op_threads_;
  int account_;
  stages::DeviceContext* context_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool has_job_ = false, done_ = false, stop_ = false, on_caller_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

/// Fork-join over workers: runs `job(i)` on workers[i] for every i in `which` at once and, when
/// given, `here` on the calling thread meanwhile; returns once every one has finished. The result
/// is the first error: here's, else the workers' in `which` order; null when none failed. With
/// `errors`, every worker's own error is also left in (*errors)[i] (sized to workers.size()).
std::exception_ptr fork_join(const std::vector<Worker*>& workers, const std::vector<int>& which,
                             const std::function<void(int)>& job, const std::function<void()>& here = nullptr,
                             std::vector<std::exception_ptr>* errors = nullptr);
std::exception_ptr fork_join(const std::vector<std::unique_ptr<Worker>>& workers, const std::vector<int>& which,
                             const std::function<void(int)>& job, const std::function<void()>& here = nullptr,
                             std::vector<std::exception_ptr>* errors = nullptr);

}  // namespace pipetrain::pipeline
