// Pipeline (pipeline.h): evaluation through the stages, and the accessors.
#include <torch/torch.h>

#include "common/error.h"
#include "pipeline/impl.h"

namespace pipetrain::pipeline {

// A forward-only pipeline: the batch is split into the configured micro-batches, which flow
// through the stages as in training (each device takes them in order, so no device waits on a
// later one), with no gradients, no recomputation and the layers in evaluation mode.
at::Tensor Pipeline::predict(const at::Tensor& input) {
  Impl& p = *impl_;
  p.check_usable();
  // Data parallelism: the copies hold the same parameters; copy 0 alone evaluates.
  if (p.copy > 0) return at::Tensor();
  const int M = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(p.options.micro_batches, input.size(0))));
  const std::vector<at::Tensor> parts = input.tensor_split(M, 0);
  std::vector<at::Tensor> outputs(M);
  const int V = static_cast<int>(p.stages.size());
  const int64_t tag_step = -(++p.predictions);  // never a training step
  p.model->eval();
  std::vector<std::exception_ptr> errors;
  auto job = [&p, &parts, &outputs, M, V, tag_step](int r) {
      torch::NoGradGuard no_grad;
      ClearAutocastCache clear_cache;
      comm::Transport& t = *p.transports[r];
      LocalHandoff local;
      try {
        for (int m = 0; m < M; ++m)
          for (int c = 0; c < p.sched.chunks; ++c) {
            const int vs = p.sched.virtual_stage(r, c);
            Skips skips;
            at::Tensor x = vs == 0 ? parts[m]
                                   : p.recv_across(r, comm::Kind::Activation, vs - 1, c, vs - 1, m, tag_step, &skips, local);
            try {
              x = p.stages[vs]->forward_only(x, skips, &skips);
            } catch (const c10::Error& e) {
              throw Error(detail::concat("stage ", r, ": forward (evaluation) of micro-batch ", m, ": ",
                                         e.what_without_backtrace()));
            }
            if (vs == V - 1)
              outputs[m] = x;
            else
              p.send_across(r, comm::Kind::Activation, vs + 1, vs, m, tag_step, x, skips, local);
          }
      } catch (const std::exception& e) {
        int none = -1;
        p.first_failure.compare_exchange_strong(none, r);
        t.abort(detail::concat("stage ", r, " failed: ", e.what()));
        throw;
      }
  };
  fork_join(p.workers, p.local, job, nullptr, &errors);
  p.model->train();
  const int failed = p.first_failure.exchange(-1);
  if (failed >= 0) {
    if (p.self >= 0) p.fail("evaluation failed", errors[failed]);
    p.transports = comm::make_transport_group(p.options.transport, p.options.stages);  // fresh mailboxes
    std::rethrow_exception(errors[failed]);
  }
  if (!p.is_local_device(p.last_device())) return at::Tensor();
  return M == 1 ? outputs[0] : torch::cat(outputs, 0);
}

int Pipeline::rank() const { return impl_->self < 0 ? -1 : impl_->peer(impl_->self); }
bool Pipeline::is_local(int device) const { return impl_->is_local_device(device); }
bool Pipeline::is_local_stage(int virtual_stage) const { return impl_->runs(virtual_stage); }

comm::Collectives& Pipeline::collectives() { return impl_->group; }
int Pipeline::rank_of(int device) const { return impl_->self < 0 ? 0 : impl_->mesh.rank(device, 0); }

int Pipeline::stages() const { return impl_->options.stages; }
const partitioner::Balance& Pipeline::balance() const { return impl_->balance; }
const schedule::Schedule& Pipeline::schedule() const { return impl_->sched; }
const StepTrace& Pipeline::last_trace() const { return impl_->trace; }
int64_t Pipeline::step() const { return impl_->step; }
int Pipeline::fewest_micro_batches() const { return impl_->fewest ? impl_->fewest : impl_->configured.micro_batches; }
void Pipeline::set_step(int64_t step) {
  impl_->on_every_copy([step](Impl& p) { p.step = step; });
}
torch::optim::Optimizer* Pipeline::optimizer(int virtual_stage) {
  return impl_->optimizers.at(virtual_stage).get();
}
torch::nn::Sequential& Pipeline::stage_layers(int virtual_stage) {
  return impl_->stages.at(virtual_stage)->layers();
}


}  // namespace pipetrain::pipeline
