// Pipeline (pipeline.h): the public face of the executor (executor.h) and of the stage
// optimizers beside it (optimizers.h).
#include "pipeline/pipeline.h"

#include <algorithm>

#include "common/error.h"
#include "pipeline/executor.h"

namespace pipetrain::pipeline {

Pipeline::Pipeline(torch::nn::Sequential model, PipelineOptions options, stages::LossFn loss)
    : impl_(std::make_unique<Executor>()), optimizers_(new StageOptimizers(*impl_)) {
  std::unique_ptr<comm::Transport> none;
  impl_->init(std::move(model), std::move(options), std::move(loss), none);
}

Pipeline::Pipeline(torch::nn::Sequential model, PipelineOptions options, stages::LossFn loss,
                   std::unique_ptr<comm::Transport> endpoint, comm::ProcessGroup copies)
    : impl_(std::make_unique<Executor>()), optimizers_(new StageOptimizers(*impl_)) {
  if (!endpoint) throw ConfigError("pipeline: a multi-process pipeline needs a transport endpoint");
  try {
    if (options.data_parallel > 1 && !copies)
      throw ConfigError("pipeline: data parallelism across processes needs the process group of this rank's copies");
    impl_->device_groups.assign(std::max(1, options.stages), copies);
    impl_->init(std::move(model), std::move(options), std::move(loss), endpoint);
  } catch (const std::exception& e) {
    // The peers are constructing too, or already waiting for this rank's part of the layout:
    // aborting the endpoint (wherever it is by now) tells them at once, naming this rank.
    comm::Transport* t = endpoint ? endpoint.get()
                                  : impl_->self >= 0 ? impl_->transports[impl_->self].get() : nullptr;
    if (t) t->abort(detail::concat("rank ", t->rank(), " failed: ", e.what()));
    throw;
  }
}

Pipeline::~Pipeline() = default;

StageOptimizers& Pipeline::optimizers() { return *optimizers_; }

double Pipeline::train_step(const at::Tensor& input, const at::Tensor& target) {
  return impl_->run(input, target, /*apply_optimizer=*/true, false, 1.0);
}

double Pipeline::forward_backward(const at::Tensor& input, const at::Tensor& target, bool accumulate, double scale) {
  return impl_->run(input, target, /*apply_optimizer=*/false, accumulate, scale);
}

at::Tensor Pipeline::predict(const at::Tensor& input) {
  impl_->check_usable();
  // Data parallelism: the copies hold the same parameters; copy 0 alone evaluates.
  if (impl_->copy > 0) return at::Tensor();
  return impl_->evaluate(input);
}

void Pipeline::sync_gradients(bool on) {
  impl_->on_every_copy([on](Executor& p) { p.sync = on; });
}
void Pipeline::sync_copies() { impl_->sync_copies(); }

const comm::Mesh& Pipeline::mesh() const { return impl_->mesh; }
int Pipeline::rank() const { return impl_->self < 0 ? -1 : impl_->peer(impl_->self); }
int Pipeline::copy() const { return impl_->copy; }
bool Pipeline::is_local(int device) const { return impl_->is_local_device(device); }
bool Pipeline::is_local_stage(int virtual_stage) const { return impl_->runs(virtual_stage); }
int Pipeline::rank_of(int device) const { return impl_->self < 0 ? 0 : impl_->mesh.rank(device, 0); }
comm::Collectives& Pipeline::collectives() { return impl_->group; }

int Pipeline::stages() const { return impl_->options.stages; }
const partitioner::Balance& Pipeline::balance() const { return impl_->balance; }
const schedule::Schedule& Pipeline::schedule() const { return impl_->sched; }
const StepTrace& Pipeline::last_trace() const { return impl_->trace; }
int64_t Pipeline::step() const { return impl_->step; }
void Pipeline::set_step(int64_t step) {
  impl_->on_every_copy([step](Executor& p) { p.step = step; });
}
int Pipeline::fewest_micro_batches() const { return impl_->fewest ? impl_->fewest : impl_->configured.micro_batches; }
int64_t Pipeline::take_device_peak(int device) {
  if (device < 0 || device >= static_cast<int>(impl_->contexts.size()) || !impl_->contexts[device]) return 0;
  const int64_t peak = impl_->contexts[device]->peak_bytes();
  impl_->contexts[device]->reset_peak();
  return peak;
}
const std::vector<std::pair<std::string, std::string>>& Pipeline::tied_names() const { return impl_->tied_names; }
torch::nn::Sequential& Pipeline::stage_layers(int virtual_stage) { return impl_->stages.at(virtual_stage)->layers(); }

}  // namespace pipetrain::pipeline
