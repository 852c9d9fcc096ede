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
