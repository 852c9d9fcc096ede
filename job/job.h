// A job: everything a config describes, built and checked (model, data, pipeline options), and
// the pieces of a run that follow from the config alone (its optimizer and its loss).
#pragma once

#include <ATen/core/Tensor.h>

#include "models/model.h"
#include "pipeline/pipeline.h"
#include "stages/device.h"
#include "job/config.h"
#include "job/data.h"

namespace pipetrain::job {

// The engine's vocabulary, as the run layer uses it.
using pipeline::NonFiniteGradient;
using pipeline::OptimizerFactory;
using pipeline::Pipeline;
using pipeline::PipelineOptions;
using pipeline::StepTrace;

struct Job {
  Config config;
  models::Model model;
  Dataset data;
  PipelineOptions options;  // options.balance: the config's list; a method is resolved by job/balance.h
  at::ScalarType dtype;
  // pipeline.devices, decided once (stages::resolve_devices; a rank of runtime.kind processes by its
  // place among its host's ranks); options.devices is its per_stage list.
  stages::StageDevices devices;
  // pipeline.defer_weight_grads "auto" as decided for this job, with the reason
  // ("auto: deferred, predicted 12% faster"; planner::resolve_deferral); empty until decided, and
  // when the config forces it.
  std::string deferral;
};

// The config's model, built with torch's generator seeded by train.seed, in runtime.dtype.
models::Model build_model(const Config& config);

// Builds the model (seeded by train.seed) and the data set and checks stages and balance
// against the layer count; every problem is a ConfigError or DataError.
Job prepare(const Config& config);

// Turns a data batch into model inputs of the job's dtype.
Batch to_model(const Job& job, Batch b);

// Builds a torch optimizer over `params` from the config's optimizer section: libtorch's, its
// step one fused kernel per device and dtype (job/fused_optimizers.h).
OptimizerFactory make_optimizer_factory(const OptimizerConfig& config);

// Cross-entropy over the last dimension with mean reduction (classifiers and language models);
// from kChunkedCrossEntropyClasses classes on, in chunks of rows (job/cross_entropy.h).
at::Tensor mean_cross_entropy(const at::Tensor& output, const at::Tensor& target);

// What a device of `pipe` holds between steps: its stages' parameters and optimizer state (a
// sharded optimizer's slice included). 0 for a device run by another rank.
int64_t held_bytes(Pipeline& pipe, int device);

}  // namespace pipetrain::job
