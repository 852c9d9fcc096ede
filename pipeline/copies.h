// Internal to the pipeline module: the data-parallel copies of a Pipeline that run in this
// process, as equal peers, each an executor (executor.h) of its own. In-process there are D of
// them, each over its own clone of the model (copy 0 over the caller's), with its own stages,
// runners and local transport, and a c10d group per device among the copies' runners of that
// device; across processes a rank holds its one copy. Whatever concerns every copy runs on each
// at once, each on its own driver thread (the first's: the calling thread, as a pipeline of one
// stage runs there, worker.h), and the first error is rethrown (copies.cpp).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "pipeline/executor.h"

namespace pipetrain::pipeline {

class Copies {
 public:
  Copies(torch::nn::Sequential model, PipelineOptions options, stages::LossFn loss);  // in-process
  // Multi-process: this rank's copy over `endpoint`; `copies`, the process group of this rank's
  // copies (data parallelism). A failure aborts the endpoint, naming this rank, wherever it is by then.
  Copies(torch::nn::Sequential model, PipelineOptions options, stages::LossFn loss,
         std::unique_ptr<comm::Transport> endpoint, comm::ProcessGroup copies);
  ~Copies();

  // The lowest-numbered copy here, which answers for all: they hold the same parameters and
  // run the same steps.
  Executor& front() { return *copies_.front(); }
  const std::vector<Executor*>& all() const { return all_; }
  void each(const std::function<void(Executor&)>& f);  // every copy here at once
  // A step on every copy here, each on its shard: the loss of the whole batch.
  double run(const at::Tensor& input, const at::Tensor& target, bool apply_optimizer, bool accumulate, double scale);
  void sync();  // Pipeline::sync_copies: every copy takes the first's parameters and optimizer state

 private:
  std::vector<std::unique_ptr<Executor>> copies_;
  std::vector<Executor*> all_;
  std::vector<std::unique_ptr<Worker>> drivers_;  // by copy; the first's is the calling thread (null)
};

}  // namespace pipetrain::pipeline
