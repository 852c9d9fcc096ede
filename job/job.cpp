// Building what a config describes (job/job.h).
#include "job/job.h"
#include "job/cross_entropy.h"
#include "job/fused_optimizers.h"
#include "job/tensors_data.h"

#include <torch/torch.h>

#include "common/error.h"
#include "common/strings.h"
#include "comm/launcher_env.h"
#include "pipeline/optimizer_state.h"
#include "models/layers.h"
#include "stages/device.h"

namespace pipetrain::job {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) { return c10::str(c10::IntArrayRef(shape)); }

// A TorchScript model's input is the data's when the data is tensors: model.input_shape may be
// left out, and taken from the samples (whose origin errors then name); given, it must be theirs.
void input_from_data(const Config& c, nlohmann::json& model, std::shared_ptr<const Origins>& origins) {
  const auto family = model.find("family");
  if (c.data.kind != DataKind::Tensors || family == model.end() || *family != "torchscript") return;
  const std::vector<int64_t> data = tensors_sample_shape(c);
  const std::string samples = "the samples of data.path " + printable(c.data.path, 200);
  const auto given = model.find("input_shape");
  if (given == model.end()) {
    model["input_shape"] = data;
    auto from = std::make_shared<Origins>(origins ? *origins : Origins{});
    (*from)["model.input_shape"] = samples + " (shape " + shape_text(data) + ")";
    origins = std::move(from);
    return;
  }
  // As read_input reads it; what it refuses (not a list of positive integers) it reports itself.
  std::vector<int64_t> declared;
  if (!given->is_array()) return;
  for (const auto& d : *given) {
    if (!d.is_number()) return;
    declared.push_back(static_cast<int64_t>(d.get<double>()));
  }
  if (declared != data)
    throw ConfigError(c.where("model.input_shape") + ": " + shape_text(declared) + ", but " + samples + " have shape " +
                      shape_text(data) + "; leave model.input_shape out to take the data's");
}

// The place among its host's ranks of a rank that a launcher started for runtime.kind processes
// (which GPU "auto" gives it); -1 in-process or without a launcher (make_pipeline then says
// what is missing).
int local_rank_of_rank(bool processes) {
  if (!processes) return -1;
  try {
    const comm::RankInfo info = comm::rank_from_env(comm::process_environment());
    return info.launcher == "none" ? -1 : info.local_rank;
  } catch (const ConfigError&) {
    return -1;
  }
}

}  // namespace

models::Model build_model(const Config& c) {
  nlohmann::json model = c.model;
  std::shared_ptr<const Origins> origins = c.origins;
  input_from_data(c, model, origins);
  JsonReader model_reader(model, "model", c.source, origins);
  models::Model m = models::build(model_reader, c.train.seed);
  m.layers->to(c.runtime.dtype == DType::Float64 ? torch::kDouble : torch::kFloat);
  if (m.frozen != Precision::FP32) {
    const std::string name = precision_name(m.frozen);
    if (c.train.precision != m.frozen)
      throw ConfigError(c.where("model.frozen_dtype") + ": \"" + name + "\" needs train.precision \"" + name +
                        "\" (the frozen weights' products compute in it), not \"" + precision_name(c.train.precision) + "\"");
    if (models::store_frozen(m) == 0)
      throw ConfigError(c.where("model.frozen_dtype") + ": \"" + name + "\", but no Linear weight is frozen (model.freeze or the " +
                        "hf family's \"lora\" freezes them)");
  }
  return m;
}

Job prepare(const Config& c) {
  Job job{c, build_model(c), {}, {}, c.runtime.dtype == DType::Float64 ? torch::kDouble : torch::kFloat, {}, {}};
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
  // "auto" stays off until the run decides it (planner::resolve_deferral).
  o.defer_weight_grads = c.pipeline.defer_weight_grads == DeferWeightGrads::On;
  o.cuda_graphs = c.pipeline.cuda_graphs;
  o.precision = c.train.precision;
  const bool processes = c.runtime.kind == RuntimeKind::Processes;
  job.devices = stages::resolve_devices(c.pipeline.devices, c.pipeline.stages, c.where("pipeline.devices"),
                                        local_rank_of_rank(processes));
  o.devices = job.devices.per_stage;
  // In-process every copy's stages are threads of this process.
  o.intra_op_threads = intra_op_threads(c.runtime, c.pipeline.stages * (processes ? 1 : c.pipeline.data_parallel));
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
