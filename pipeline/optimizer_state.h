// optimizer_state: the one codec of a stage optimizer's per-parameter state. Data-parallel
// copies deep-copy it and shard it, checkpoints save and load it, jobs count its bytes, and the
// planner sizes it, all through the table here: a new optimizer kind is one row and one builder.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>

#include "common/optimizer_kind.h"

namespace pipetrain::pipeline {

using ::pipetrain::OptimizerKind;

/// One row of the optimizer table.
struct OptimizerInfo {
  OptimizerKind kind;                ///< the row's kind
  bool counts_steps;                 ///< its state holds a step count (Adam's bias correction)
  std::vector<std::string> fields;   ///< its per-element state tensors, each shaped as the parameter
  std::vector<std::string> required;  ///< the fields a state cannot lack once it has any
};

const OptimizerInfo& info(OptimizerKind kind);  ///< the kind's row (common/optimizer_kind.h names them)
/// The kind of a state torch made; nullopt for a kind not in the table.
std::optional<OptimizerKind> kind_of(const torch::optim::OptimizerParamState& state);

/// One parameter's optimizer state as plain data: the step count (kinds that count steps) and
/// the per-element tensors by field name (undefined tensors left out).
struct ParamState {
  OptimizerKind kind = OptimizerKind::SGD;  ///< whose state
  int64_t step = 0;                         ///< counts_steps kinds only
  std::map<std::string, at::Tensor> tensors;  ///< by field name
};

/// The state as data (tensors shared, not copied); Error for a kind not in the table.
ParamState to_param_state(const torch::optim::OptimizerParamState& state);
/// torch's state from data. Null when `s` holds nothing (no required field and no step: the
/// parameter has not been stepped); Error naming the missing field when it holds only part.
std::unique_ptr<torch::optim::OptimizerParamState> make_param_state(const ParamState& s);
/// A deep copy (torch's clone() shares the tensors).
std::unique_ptr<torch::optim::OptimizerParamState> deep_copy(const torch::optim::OptimizerParamState& state);
/// Bytes of every state tensor the optimizer holds.
int64_t state_bytes(const torch::optim::Optimizer& optimizer);
/// State tensors per parameter tensor, each of the parameter's size: SGD 1 with momentum, else 0;
/// Adam and AdamW 2 (their moments; max_exp_avg_sq only with amsgrad, which configs do not set).
double state_tensors_per_parameter(OptimizerKind kind, double momentum);

}  // namespace pipetrain::pipeline
