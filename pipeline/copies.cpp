// The data-parallel copies of a Pipeline in this process (copies.h).
#include "pipeline/copies.h"

#include <torch/torch.h>

#include "common/error.h"

namespace pipetrain::pipeline {

Copies::Copies(torch::nn::Sequential model, PipelineOptions options, stages::LossFn loss) {
  const int D = options.data_parallel;
  std::unique_ptr<comm::Transport> none;
  // Each device's copies reduce over a c10d group of their own (Gloo on the CPU).
  std::vector<std::vector<comm::ProcessGroup>> groups;
  if (D > 1 && options.stages >= 1) groups = comm::make_local_gloo_groups(options.stages, D, options.timeout_s);
  auto groups_of = [&](int d) {
    std::vector<comm::ProcessGroup> mine;
    for (const auto& g : groups) mine.push_back(g[d]);
    return mine;
  };
  for (int d = 0; d < std::max(1, D); ++d) {
    torch::nn::Sequential layers = model;
    if (d > 0) {
      auto clone = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());
      if (!clone) throw Error("pipeline: cannot copy the model for data parallelism");
      // torch's clone makes every parameter trainable: the copy's frozen ones frozen as the model's.
      const auto mine = model->parameters(), theirs = clone->parameters();
      for (size_t i = 0; i < mine.size() && i < theirs.size(); ++i) theirs[i].requires_grad_(mine[i].requires_grad());
      layers = torch::nn::Sequential(clone);
      options.balance = copies_.front()->balance();  // the first's, as resolved
    }
    copies_.push_back(std::make_unique<Executor>());
    copies_.back()->init(layers, options, loss, none, groups_of(d), d);
    drivers_.push_back(d == 0 ? nullptr : std::make_unique<Worker>(detail::concat("copy ", d), options.intra_op_threads));
  }
  for (auto& c : copies_) all_.push_back(c.get());
}

Copies::Copies(torch::nn::Sequential model, PipelineOptions options, stages::LossFn loss,
               std::unique_ptr<comm::Transport> endpoint, comm::ProcessGroup copies) {
  if (!endpoint) throw ConfigError("pipeline: a multi-process pipeline needs a transport endpoint");
  copies_.push_back(std::make_unique<Executor>());
  all_.push_back(copies_.back().get());
  drivers_.push_back(nullptr);
  try {
    if (options.data_parallel > 1 && !copies)
      throw ConfigError("pipeline: data parallelism across processes needs the process group of this rank's copies");
    std::vector<comm::ProcessGroup> groups(std::max(1, options.stages), copies);
    copies_.back()->init(std::move(model), std::move(options), std::move(loss), endpoint, std::move(groups), 0);
  } catch (const std::exception& e) {
    // The peers are constructing too, or already waiting for this rank's part of the layout:
    // aborting the endpoint (wherever it is by now) tells them at once, naming this rank.
    comm::Transport* t = endpoint ? endpoint.get() : copies_.back()->endpoint();
    if (t) t->abort(detail::concat("rank ", t->rank(), " failed: ", e.what()));
    throw;
  }
}

Copies::~Copies() = default;

void Copies::each(const std::function<void(Executor&)>& f) {
  std::vector<int> others;
  for (size_t i = 1; i < copies_.size(); ++i) others.push_back(static_cast<int>(i));
  if (auto error = fork_join(drivers_, others, [&](int i) { f(*copies_[i]); }, [&] { f(*copies_[0]); }))
    std::rethrow_exception(error);
}

double Copies::run(const at::Tensor& input, const at::Tensor& target, bool apply_optimizer, bool accumulate,
                   double scale) {
  if (copies_.size() == 1) return front().run_step(input, target, apply_optimizer, accumulate, scale);
  std::vector<double> part(copies_.size(), 0.0);
  each([&](Executor& e) { part[e.copy()] = e.run_step(input, target, apply_optimizer, accumulate, scale); });
  double loss = 0;
  for (double l : part) loss += l;
  return loss;
}

void Copies::sync() {
  front().refresh_shards();
  for (size_t i = 1; i < copies_.size(); ++i) copies_[i]->copy_from(front());
}

}  // namespace pipetrain::pipeline
