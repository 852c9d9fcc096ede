// LoRA adapters beside a block's projections (models/lora.h).
#include "models/lora.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/json_reader.h"
#include "common/strings.h"
#include "models/layers.h"

namespace pipetrain::models {

double Lora::scaling() const { return rank > 0 ? alpha / (rslora ? std::sqrt(double(rank)) : double(rank)) : 0; }

bool Lora::adapts(const std::string& name) const {
  return rank > 0 && std::find(targets.begin(), targets.end(), name) != targets.end();
}

const std::vector<std::string>& lora_target_names() {
  static const std::vector<std::string> names{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return names;
}

LoraTargets read_lora_targets(JsonReader& r, const std::string& key) {
  const auto& names = lora_target_names();
  const nlohmann::json* t = r.get_raw(key);
  if (!t) return {false, {"q_proj", "v_proj"}};
  if (t->is_string() && (*t == "all" || *t == "all-linear")) return {true, names};
  if (!t->is_array() || t->empty())
    r.fail(key, "must be \"all\" or a list of projection names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
  LoraTargets out;
  for (const nlohmann::json& n : *t) {
    if (!n.is_string() || std::find(names.begin(), names.end(), n.get<std::string>()) == names.end())
      r.fail(key, detail::concat("names ", n.dump(), ", not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"));
    if (std::find(out.names.begin(), out.names.end(), n.get<std::string>()) != out.names.end())
      r.fail(key, detail::concat("names ", n.get<std::string>(), " twice"));
    out.names.push_back(n.get<std::string>());
  }
  return out;
}

namespace {
uint64_t stream_of(const Lora& lora, const std::string& target) {
  const auto& n = lora_target_names();
  return lora.stream + static_cast<uint64_t>(std::find(n.begin(), n.end(), target) - n.begin());
}
}  // namespace

LoraLinearImpl::LoraLinearImpl(int64_t in, int64_t out, bool bias, Lora lora, const std::string& target)
    : torch::nn::LinearImpl(torch::nn::LinearOptions(in, out).bias(bias)),
      lora_(std::move(lora)),
      target_(target),
      stream_(stream_of(lora_, target)),
      scaling_(lora_.scaling()) {
  // PEFT's start: A as torch's Linear's (Kaiming-uniform, a = sqrt(5)), B zero.
  register_module("lora_A", torch::nn::Linear(torch::nn::LinearOptions(in, lora_.rank).bias(false)));
  auto b = register_module("lora_B", torch::nn::Linear(torch::nn::LinearOptions(lora_.rank, out).bias(false)));
  torch::NoGradGuard no_grad;
  b->weight.zero_();
}

std::shared_ptr<torch::nn::Module> LoraLinearImpl::clone(const std::optional<at::Device>& device) const {
  torch::NoGradGuard no_grad;
  auto copy = std::make_shared<LoraLinearImpl>(options.in_features(), options.out_features(), options.bias(), lora_, target_);
  auto theirs = copy->named_parameters();
  for (const auto& p : named_parameters()) {
    at::Tensor& t = theirs[p.key()];
    t.set_data(device && p.value().device() != *device ? p.value().to(*device) : p.value().clone());
    t.requires_grad_(p.value().requires_grad());
  }
  copy->train(is_training());
  return copy;
}

at::Tensor LoraLinearImpl::adapter(const at::Tensor& x) const {
  // The children as they are now: a module cloned into this one (Cloneable's clone_) brings its own.
  const auto children = named_children();
  const auto* a = children.find("lora_A");
  const auto* b = children.find("lora_B");
  PIPETRAIN_CHECK(a && b, "a LoRA projection without its adapter");
  const at::Tensor& A = std::static_pointer_cast<torch::nn::LinearImpl>(*a)->weight;
  const at::Tensor& B = std::static_pointer_cast<torch::nn::LinearImpl>(*b)->weight;
  at::Tensor in = x;
  if (is_training() && lora_.dropout > 0) in = DropoutImpl(lora_.dropout, stream_).forward(x);
  return models::linear(models::linear(in, A, at::Tensor()), B, at::Tensor()) * scaling_;
}

torch::nn::Linear lora_linear(const Lora& lora, const std::string& name, int64_t in, int64_t out, bool bias) {
  if (!lora.adapts(name)) return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  std::shared_ptr<torch::nn::LinearImpl> adapted = std::make_shared<LoraLinearImpl>(in, out, bias, lora, name);
  return torch::nn::Linear(adapted);
}

at::Tensor project(const torch::nn::Linear& l, const at::Tensor& x, bool bias_apart) {
  at::Tensor y;
  if (!bias_apart) {
    y = linear(x, l->weight, l->bias);
  } else {
    y = torch::matmul(x, l->weight.t());
    if (l->bias.defined()) y = y + l->bias;
  }
  if (const auto* adapted = dynamic_cast<const LoraLinearImpl*>(l.get())) return y + adapted->adapter(x);
  return y;
}

}  // namespace pipetrain::models
