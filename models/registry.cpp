#include <fnmatch.h>

#include <map>
#include <mutex>

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
  model.finish();
  return m;
}

std::vector<std::string> layer_names(const torch::nn::Sequential& layers) {
  std::vector<std::string> names;
  for (const auto& item : layers->named_children()) names.push_back(item.key());
  return names;
}

std::vector<at::Tensor> trainable_parameters(const torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : m.parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

}  // namespace pipetrain::models
