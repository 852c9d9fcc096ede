#include "pipeline/worker.h"

#include <ATen/Parallel.h>

#include "common/memory_account.h"

namespace pipetrain::pipeline {

Worker::Worker(std::string name, int intra_op_threads, int memory_account, stages::DeviceContext* context,
               bool on_caller)
    : name_(std::move(name)), intra_op_threads_(intra_op_threads), account_(memory_account), context_(context),
      on_caller_(on_caller) {
  if (!on_caller_) thread_ = std::thread([this] { loop(); });
}

Worker::~Worker() {
  if (on_caller_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

// The job inside the stage's device context, which is synchronised after it: its first error.
std::exception_ptr Worker::run(const std::function<void()>& job) {
  std::exception_ptr error;
  try {
    std::unique_ptr<stages::DeviceContext::Scope> scope;
    if (context_) scope = context_->enter();
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    if (context_) context_->synchronize();
  } catch (...) {
    if (!error) error = std::current_exception();
  }
  return error;
}

void Worker::submit(std::function<void()> job) {
  if (on_caller_) {
    const int threads = at::get_num_threads();
    const int account = memory_account();
    // Only where it differs (each call also sets OpenMP's and MKL's counts).
    if (threads != intra_op_threads_) at::set_num_threads(intra_op_threads_);
    memory_account() = account_;
    const std::exception_ptr error = run(job);
    if (threads != intra_op_threads_) at::set_num_threads(threads);
    memory_account() = account;
    error_ = error;
    done_ = true;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = std::move(job);
    has_job_ = true;
    done_ = false;
    error_ = nullptr;
  }
  cv_.notify_all();
}

std::exception_ptr Worker::wait() {
  if (on_caller_) return error_;
  // Bounded by the job itself: every blocking call inside a stage has a deadline.
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
  return error_;
}

void Worker::loop() {
  // libtorch initialises a thread's intra-op count lazily from a process-wide value; do that
  // first so the explicit setting below is the one that sticks for this thread.
  at::get_num_threads();
  at::set_num_threads(intra_op_threads_);
  memory_account() = account_;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return has_job_ || stop_; });
    if (stop_) return;
    auto job = std::move(job_);
    has_job_ = false;
    lock.unlock();
    const std::exception_ptr error = run(job);
    lock.lock();
    error_ = error;
    done_ = true;
    cv_.notify_all();
  }
}

std::exception_ptr fork_join(const std::vector<std::unique_ptr<Worker>>& workers, const std::vector<int>& which,
                             const std::function<void(int)>& job, const std::function<void()>& here,
                             std::vector<std::exception_ptr>* errors) {
  std::vector<Worker*> plain;
  for (const auto& w : workers) plain.push_back(w.get());
  return fork_join(plain, which, job, here, errors);
}

std::exception_ptr fork_join(const std::vector<Worker*>& workers, const std::vector<int>& which,
                             const std::function<void(int)>& job, const std::function<void()>& here,
                             std::vector<std::exception_ptr>* errors) {
  for (int i : which) workers.at(i)->submit([&job, i] { job(i); });
  std::exception_ptr first;
  if (here) {
    try {
      here();
    } catch (...) {
      first = std::current_exception();
    }
  }
  if (errors) errors->assign(workers.size(), nullptr);
  for (int i : which) {
    std::exception_ptr e = workers[i]->wait();
    if (errors) (*errors)[i] = e;
    if (e && !first) first = e;
  }
  return first;
}

}  // namespace pipetrain::pipeline
