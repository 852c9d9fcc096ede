// Building what a config describes (job/job.h).
#include "job/job.h"
#include "job/cross_entropy.h"
#include "job/fused_optimizers.h"

#include <torch/torch.h>

#include "common/error.h"
#include "common/strings.h"
#include "pipeline/optimizer_state.h"
#include "models/layers.h"
#include "stages/device.h"

namespace pipetrain::job {

models::Model build_model(const Config& c) {
  JsonReader model_reader(c.model, "model", c.source, c.origins);
  models::Model m = models::build(model_reader, c.train.seed);
  m.layers->to(c.runtime.dtype == DType::Float64 ? torch::kDouble : torch::kFloat);
  return m;
}

Job prepare(const Config& c) {
  Job job{c, build_model(c), {}, {}, c.runtime.dtype == DType::Float64 ? torch::kDouble : torch::kFloat, {}};
  const int layers = static_cast<int>(job.model.layers->size());
  const int V = c.pipeline.stages * c.pipeline.chunks;
  if (V > layers)
    throw ConfigError(
        c.where("pipeline.stages") + ": " + std::to_string(c.pipeline.stages) + " stages" +
        (c.pipeline.chunks > 1 ? " x " + std::to_string(c.pipeline.chunks) + " chunks (" + std::to_string(V) + " virtual stages)" : "") +
        " but the model has only " + std::to_string(layers) + " layers (" +
        join(models::layer_names(job.model.layers), ", ") + ")");
  if (!c.pipeline.balance.empty())
    partitioner::check(c.pipeline.balance, layers, V, c.where("pipeline.balance"));
  job.data = load_dataset(c, job.model);

  PipelineOptions& o = job.options;
  o.stages = c.pipeline.stages;
  o.micro_batches = c.pipeline.micro_batches;
  o.schedule = c.pipeline.schedule;
  o.chunks = c.pipeline.chunks;
  o.recompute = c.pipeline.recompute;
  o.defer_weight_grads = c.pipeline.defer_weight_grads;
  o.precision = c.train.precision;
  // In-process every copy's stages are threads of this process.
  std::string note;
  o.devices = stages::resolve_devices(c.pipeline.devices, c.pipeline.stages, c.where("pipeline.devices"), &note);
  job.device_note = note;
  o.intra_op_threads = intra_op_threads(c.runtime, c.pipeline.stages * (c.runtime.kind == RuntimeKind::Processes ? 1 : c.pipeline.data_parallel));
  o.data_parallel = c.pipeline.data_parallel;
  o.shard_optimizer = c.train.shard_optimizer;
  o.bucket_bytes = c.pipeline.bucket_bytes;
  o.timeout_s = c.runtime.timeout_s;
  o.seed = c.train.seed;
  o.transport.max_message_bytes = c.runtime.max_message_bytes;
  o.transport.backend = c.runtime.transport;
  o.transport.timeout_s = c.runtime.timeout_s;
  o.transport.detect_peer_failure = c.runtime.detect_peer_failure;
  o.balance = c.pipeline.balance;  // a method other than a list: job/balance.h resolves it
  o.ties = job.model.ties;
  return job;
}

Batch to_model(const Job& job, Batch b) {
  if (b.input.is_floating_point()) b.input = b.input.to(job.dtype);
  return b;
}

OptimizerFactory make_optimizer_factory(const OptimizerConfig& c) {
  return [c](std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
    switch (c.kind) {
      case OptimizerKind::SGD:
        return std::make_unique<FusedSGD>(
            params, torch::optim::SGDOptions(c.lr).momentum(c.momentum).nesterov(c.nesterov).weight_decay(c.weight_decay));
      case OptimizerKind::Adam:
        return std::make_unique<FusedAdam>(
            params, torch::optim::AdamOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay));
      case OptimizerKind::AdamW:
        return std::make_unique<FusedAdamW>(
            params, torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay));
    }
    throw ConfigError(detail::concat("optimizer.kind: no builder for optimizer ", static_cast<int>(c.kind)));
  };
}

int64_t held_bytes(Pipeline& pipe, int device) {
  int64_t held = 0;
  for (int vs = 0; vs < pipe.schedule().virtual_stages(); ++vs) {
    if (pipe.schedule().device_of(vs) != device || !pipe.is_local_stage(vs)) continue;
    for (const auto& p : pipe.stage_layers(vs)->parameters()) held += static_cast<int64_t>(p.nbytes());
    if (torch::optim::Optimizer* opt = pipe.optimizers().of(vs)) {
      held += pipeline::state_bytes(*opt);
      if (pipe.optimizers().sharded())  // the slice it steps, the optimizer's own tensor
        for (const auto& group : opt->param_groups())
          for (const auto& p : group.params()) held += static_cast<int64_t>(p.nbytes());
    }
  }
  return held;
}

at::Tensor mean_cross_entropy(const at::Tensor& output, const at::Tensor& target) {
  if (output.size(-1) >= kChunkedCrossEntropyClasses) return chunked_cross_entropy(output, target);
  return torch::nn::functional::cross_entropy(output.reshape({-1, output.size(-1)}), target.reshape({-1}));
}

}  // namespace pipetrain::job
