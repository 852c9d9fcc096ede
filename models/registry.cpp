#include <fnmatch.h>

#include <map>
#include <mutex>
#include <set>

#include <torch/torch.h>

#include "common/error.h"
#include "common/strings.h"
#include "models/families.h"
#include "models/hf.h"

namespace pipetrain::models {

namespace {
struct Registry {
  std::mutex mu;
  std::map<std::string, Builder> builders{
      {"mlp", build_mlp}, {"cnn", build_cnn}, {"gpt", build_gpt}, {"unet", build_unet}, {"layers", build_layer_list},
      {"torchscript", build_torchscript}, {"hf", build_hf}};
};
Registry& registry() {
  static Registry r;
  return r;
}

// "freeze": globs over the parameters' names (fnmatch's, "layer_0.*"), each matching some; what
// they match trains not. A tie trains whole or not at all; something must still train.
void freeze(JsonReader& model, Model& m) {
  const nlohmann::json* raw = model.get_raw("freeze");
  if (!raw) return;
  if (!raw->is_array() || raw->empty()) model.fail("freeze", "must be a list of parameter-name patterns (\"embed.*\", \"layer_[0-3].*\")");
  auto params = m.layers->named_parameters();
  for (const nlohmann::json& pattern : *raw) {
    if (!pattern.is_string() || pattern.get<std::string>().empty()) model.fail("freeze", detail::concat("holds ", pattern.dump(), ", not a pattern"));
    const std::string glob = pattern.get<std::string>();
    size_t matched = 0;
    for (auto& p : params)
      if (::fnmatch(glob.c_str(), p.key().c_str(), 0) == 0) p.value().requires_grad_(false), ++matched;
    if (matched == 0)
      model.fail("freeze", detail::concat("'", glob, "' matches no parameter (their names: '", params.begin()->key(), "', …)"));
  }
  if (trainable_parameters(*m.layers).empty()) model.fail("freeze", "leaves no parameter to train");
  const auto names = layer_names(m.layers);
  for (const Tie& tie : m.ties) {
    const auto first = m.layers->ptr(tie.front().layer)->named_parameters();
    for (const ParamRef& r : tie) {
      const auto own = m.layers->ptr(r.layer)->named_parameters();
      if (own[r.name].requires_grad() != first[tie.front().name].requires_grad())
        model.fail("freeze", detail::concat("freezes one of the tied ", names[tie.front().layer], ".", tie.front().name, " and ",
                                            names[r.layer], ".", r.name, " but not the other: one weight trains whole or not at all"));
    }
  }
}
}  // namespace

void register_family(const std::string& name, Builder builder) {
  std::lock_guard<std::mutex> lock(registry().mu);
  registry().builders[name] = std::move(builder);
}

std::vector<std::string> families() {
  std::lock_guard<std::mutex> lock(registry().mu);
  std::vector<std::string> names;
  for (const auto& [name, b] : registry().builders) names.push_back(name);
  return names;
}

Model build(JsonReader& model, uint64_t seed) {
  if (!model.has("family"))
    model.fail("family", "is required; one of: " + join(families(), ", "));
  const std::string family = model.get_choice("family", "", families());
  Builder builder;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    builder = registry().builders.at(family);
  }
  torch::manual_seed(seed);
  Model m = builder(model);
  freeze(model, m);
  m.frozen = parse_precision(model.get_choice("frozen_dtype", "fp32", precision_names()));
  model.finish();
  return m;
}

std::vector<std::string> layer_names(const torch::nn::Sequential& layers) {
  std::vector<std::string> names;
  for (const auto& item : layers->named_children()) names.push_back(item.key());
  return names;
}

std::vector<at::Tensor> frozen_linear_weights(const Model& m) {
  std::set<const void*> tied, seen;
  for (const Tie& tie : m.ties)
    for (const ParamRef& r : tie) tied.insert(m.layers->ptr(r.layer)->named_parameters()[r.name].unsafeGetTensorImpl());
  std::vector<at::Tensor> out;
  for (const auto& module : m.layers->modules(/*include_self=*/false)) {
    const auto* linear = dynamic_cast<const torch::nn::LinearImpl*>(module.get());
    if (!linear || !linear->weight.defined() || linear->weight.requires_grad()) continue;
    const void* impl = linear->weight.unsafeGetTensorImpl();
    if (!tied.count(impl) && seen.insert(impl).second) out.push_back(linear->weight);
  }
  return out;
}

size_t store_frozen(Model& m) {
  if (m.frozen == Precision::FP32) return 0;
  const at::ScalarType type = m.frozen == Precision::BF16 ? at::kBFloat16 : at::kHalf;
  torch::NoGradGuard no_grad;
  size_t changed = 0;
  for (at::Tensor w : frozen_linear_weights(m))
    if (w.scalar_type() == at::kFloat) w.set_data(w.to(type)), ++changed;
  return changed;
}

void widen_frozen(Model& m) {
  torch::NoGradGuard no_grad;
  for (at::Tensor w : frozen_linear_weights(m))
    if (w.scalar_type() == at::kBFloat16 || w.scalar_type() == at::kHalf) w.set_data(w.to(at::kFloat));
}

std::vector<at::Tensor> trainable_parameters(const torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : m.parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

}  // namespace pipetrain::models
