#include "pipeline/optimizer_state.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "common/error.h"
#include "common/strings.h"

namespace pipetrain::pipeline {

namespace {

const std::vector<OptimizerInfo>& table() {
  static const std::vector<OptimizerInfo> rows = {
      {OptimizerKind::SGD, false, {"momentum_buffer"}, {"momentum_buffer"}},
      {OptimizerKind::Adam, true, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, {"exp_avg", "exp_avg_sq"}},
      {OptimizerKind::AdamW, true, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, {"exp_avg", "exp_avg_sq"}},
  };
  return rows;
}

template <typename AdamState>
ParamState adam_like(OptimizerKind kind, const AdamState& a) {
  ParamState s{kind, a.step(), {}};
  for (const auto& [name, t] : {std::pair<const char*, at::Tensor>{"exp_avg", a.exp_avg()},
                                {"exp_avg_sq", a.exp_avg_sq()},
                                {"max_exp_avg_sq", a.max_exp_avg_sq()}})
    if (t.defined()) s.tensors[name] = t;
  return s;
}

template <typename AdamState>
std::unique_ptr<torch::optim::OptimizerParamState> fill_adam(const ParamState& s) {
  auto out = std::make_unique<AdamState>();
  out->step(s.step);
  auto get = [&](const char* name) {
    auto it = s.tensors.find(name);
    return it == s.tensors.end() ? at::Tensor() : it->second;
  };
  out->exp_avg(get("exp_avg"));
  out->exp_avg_sq(get("exp_avg_sq"));
  out->max_exp_avg_sq(get("max_exp_avg_sq"));
  return out;
}

}  // namespace

const OptimizerInfo& info(OptimizerKind kind) { return table().at(static_cast<size_t>(kind)); }
std::optional<OptimizerKind> kind_of(const torch::optim::OptimizerParamState& state) {
  // AdamW's state is not an Adam state in torch's C++ API: each kind is its own class.
  if (dynamic_cast<const torch::optim::SGDParamState*>(&state)) return OptimizerKind::SGD;
  if (dynamic_cast<const torch::optim::AdamParamState*>(&state)) return OptimizerKind::Adam;
  if (dynamic_cast<const torch::optim::AdamWParamState*>(&state)) return OptimizerKind::AdamW;
  return std::nullopt;
}

ParamState to_param_state(const torch::optim::OptimizerParamState& state) {
  const auto kind = kind_of(state);
  if (!kind) throw Error("optimizer state: only " + join(optimizer_names(), ", ") + " are covered");
  switch (*kind) {
    case OptimizerKind::SGD: {
      ParamState s{OptimizerKind::SGD, 0, {}};
      const at::Tensor& buf = static_cast<const torch::optim::SGDParamState&>(state).momentum_buffer();
      if (buf.defined()) s.tensors["momentum_buffer"] = buf;
      return s;
    }
    case OptimizerKind::Adam:
      return adam_like(*kind, static_cast<const torch::optim::AdamParamState&>(state));
    case OptimizerKind::AdamW:
      return adam_like(*kind, static_cast<const torch::optim::AdamWParamState&>(state));
  }
  throw Error("optimizer state: unknown kind");
}

std::unique_ptr<torch::optim::OptimizerParamState> make_param_state(const ParamState& s) {
  const OptimizerInfo& row = info(s.kind);
  std::vector<std::string> missing;
  for (const auto& f : row.required)
    if (!s.tensors.count(f)) missing.push_back(f);
  if (missing.size() == row.required.size() && (!row.counts_steps || s.step == 0)) return nullptr;
  if (!missing.empty())
    throw Error(detail::concat("incomplete ", optimizer_name(row.kind), " state: no ", join(missing, ", ")));
  switch (s.kind) {
    case OptimizerKind::SGD: {
      auto out = std::make_unique<torch::optim::SGDParamState>();
      out->momentum_buffer(s.tensors.at("momentum_buffer"));
      return out;
    }
    case OptimizerKind::Adam: return fill_adam<torch::optim::AdamParamState>(s);
    case OptimizerKind::AdamW: return fill_adam<torch::optim::AdamWParamState>(s);
  }
  throw Error("optimizer state: unknown kind");
}

std::unique_ptr<torch::optim::OptimizerParamState> deep_copy(const torch::optim::OptimizerParamState& state) {
  ParamState s = to_param_state(state);
  for (auto& [name, t] : s.tensors) t = t.clone();
  auto out = make_param_state(s);
  // A state torch made but that holds nothing yet (SGD without momentum) is copied as such.
  return out ? std::move(out) : state.clone();
}

int64_t state_bytes(const torch::optim::Optimizer& optimizer) {
  int64_t n = 0;
  for (const auto& [key, state] : optimizer.state())
    for (const auto& [name, t] : to_param_state(*state).tensors) n += static_cast<int64_t>(t.nbytes());
  return n;
}

double state_tensors_per_parameter(OptimizerKind kind, double momentum) {
  return kind == OptimizerKind::SGD ? (momentum != 0 ? 1.0 : 0.0) : 2.0;
}

}  // namespace pipetrain::pipeline
