// Pipeline (pipeline.h): the public face of the data-parallel copies in this process (copies.h,
// an executor each: executor.h) and of the stage optimizers beside them (optimizers.h).
#include "pipeline/pipeline.h"

#include <algorithm>

#include "common/error.h"
#include "pipeline/copies.h"

namespace pipetrain::pipeline {

Pipeline::Pipeline(torch::nn::Sequential model, PipelineOptions options, stages::LossFn loss)
    : copies_(std::make_unique<Copies>(std::move(model), std::move(options), std::move(loss))),
      optimizers_(new StageOptimizers(*copies_)) {}

Pipeline::Pipeline(torch::nn::Sequential model, PipelineOptions options, stages::LossFn loss,
                   std::unique_ptr<comm::Transport> endpoint, comm::ProcessGroup copies)
    : copies_(std::make_unique<Copies>(std::move(model), std::move(options), std::move(loss), std::move(endpoint),
                                       std::move(copies))),
      optimizers_(new StageOptimizers(*copies_)) {}

Pipeline::~Pipeline() = default;

StageOptimizers& Pipeline::optimizers() { return *optimizers_; }

double Pipeline::train_step(const at::Tensor& input, const at::Tensor& target) {
  return copies_->run(input, target, /*apply_optimizer=*/true, false, 1.0);
}

double Pipeline::forward_backward(const at::Tensor& input, const at::Tensor& target, bool accumulate, double scale) {
  return copies_->run(input, target, /*apply_optimizer=*/false, accumulate, scale);
}

at::Tensor Pipeline::predict(const at::Tensor& input) {
  Executor& e = copies_->front();
  e.check_usable();
  // Data parallelism: the copies hold the same parameters; copy 0 alone evaluates.
  if (e.copy() > 0) return at::Tensor();
  return e.evaluate(input);
}

void Pipeline::sync_gradients(bool on) {
  copies_->each([on](Executor& e) { e.set_sync(on); });
}
void Pipeline::sync_copies() { copies_->sync(); }

const comm::Mesh& Pipeline::mesh() const { return copies_->front().mesh(); }
int Pipeline::rank() const { return copies_->front().rank(); }
int Pipeline::copy() const { return copies_->front().copy(); }
bool Pipeline::is_local(int device) const { return copies_->front().is_local_device(device); }
bool Pipeline::is_local_stage(int virtual_stage) const { return copies_->front().runs(virtual_stage); }
int Pipeline::rank_of(int device) const { return copies_->front().rank() < 0 ? 0 : mesh().rank(device, 0); }
comm::Collectives& Pipeline::collectives() { return copies_->front().collectives(); }

int Pipeline::stages() const { return copies_->front().options().stages; }
const partitioner::Balance& Pipeline::balance() const { return copies_->front().balance(); }
const schedule::Schedule& Pipeline::schedule() const { return copies_->front().schedule(); }
const StepTrace& Pipeline::last_trace() const { return copies_->front().trace(); }
int64_t Pipeline::step() const { return copies_->front().step(); }
void Pipeline::set_step(int64_t step) {
  copies_->each([step](Executor& e) { e.set_step(step); });
}
int Pipeline::fewest_micro_batches() const { return copies_->front().fewest_micro_batches(); }
int64_t Pipeline::take_device_peak(int device) { return copies_->front().take_device_peak(device); }
const std::vector<std::pair<std::string, std::string>>& Pipeline::tied_names() const {
  return copies_->front().tied_names();
}
torch::nn::Sequential& Pipeline::stage_layers(int virtual_stage) { return copies_->front().stage_layers(virtual_stage); }

}  // namespace pipetrain::pipeline
