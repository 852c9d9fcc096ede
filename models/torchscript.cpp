// torchscript: a model saved from Python (`torch.jit.script(nn.Sequential(...)).save(path)`, or
// traced), split into layers by its top-level children. Each child runs through libtorch's
// TorchScript interpreter; its parameters and buffers are the loaded module's own tensors,
// registered again under the same names (a child "0" with "weight": "0.weight", as Python's
// state_dict names it), so our optimizers train them, checkpoints and `export` write them, and
// Python's load_state_dict takes the export back. What libtorch cannot do correctly here is
// refused at load, naming the submodule (docs/models.md, "Models from Python").
#include <torch/script.h>
#include <torch/torch.h>

#include "common/error.h"
#include "common/replayable.h"
#include "common/strings.h"
#include "models/families.h"

namespace pipetrain::models {

namespace {

// A submodule's parameters and buffers under its own names, its submodules as children of the
// same kind: the loaded module's hierarchy, as torch::nn modules that hold the same tensors.
class MirrorImpl : public torch::nn::Module {
 public:
  explicit MirrorImpl(const torch::jit::Module& m) {
    for (const auto& p : m.named_parameters(/*recurse=*/false)) register_parameter(p.name, p.value, p.value.requires_grad());
    for (const auto& b : m.named_buffers(/*recurse=*/false)) register_buffer(b.name, b.value);
    for (const auto& c : m.named_children()) register_module(c.name, std::make_shared<MirrorImpl>(c.value));
  }
};

// One top-level child of the loaded model: runs its forward() in the interpreter.
class ScriptLayerImpl : public torch::nn::Module {
 public:
  explicit ScriptLayerImpl(torch::jit::Module m) : module_(std::move(m)) {
    for (const auto& p : module_.named_parameters(/*recurse=*/false)) register_parameter(p.name, p.value, p.value.requires_grad());
    for (const auto& b : module_.named_buffers(/*recurse=*/false)) register_buffer(b.name, b.value);
    for (const auto& c : module_.named_children()) register_module(c.name, std::make_shared<MirrorImpl>(c.value));
  }
  at::Tensor forward(const at::Tensor& x) {
    note_not_replayable("a TorchScript layer runs in the interpreter, which a graph cannot replay");
    c10::IValue out = module_.forward({x});
    if (!out.isTensor()) throw Error("torchscript layer: its forward() returns " + out.tagKind() + ", not a tensor");
    return out.toTensor();
  }
  void train(bool on) override {
    torch::nn::Module::train(on);
    module_.train(on);
  }
  // A copy with tensors of its own (data-parallel copies): the interpreter's module deep-copied,
  // its values those of this one's now.
  std::shared_ptr<torch::nn::Module> clone(const std::optional<at::Device>& device = std::nullopt) const override {
    torch::NoGradGuard no_grad;
    auto copy = std::make_shared<ScriptLayerImpl>(module_.deepcopy());
    if (device) copy->to(*device);
    copy->train(is_training());
    return copy;
  }

 private:
  torch::jit::Module module_;
};
TORCH_MODULE(ScriptLayer);

// Submodule kinds whose training in a pipeline would not equal one device's: refused by name.
// Dropout draws from libtorch's global generator (masks differ in a recomputation, and with the
// stage count); batch norm updates its running statistics per micro-batch.
std::string refused_kind(const torch::jit::Module& m, const std::string& path) {
  const std::string kind = m.type()->name() ? m.type()->name()->qualifiedName() : "";
  const bool dropping = !m.hasattr("p") || !m.attr("p").isDouble() || m.attr("p").toDouble() > 0;
  if (kind.find("torch.nn.modules.dropout.") != std::string::npos && dropping)
    return path + " is a " + kind.substr(kind.rfind('.') + 1) +
           ": scripted dropout draws from libtorch's global generator, so its masks differ between a forward and "
           "its recomputation and with the stage count; remove it or write the network as a layer list "
           "(model.family \"layers\"), whose dropout is keyed";
  if (kind.find("torch.nn.modules.batchnorm.") != std::string::npos)
    return path + " is a " + kind.substr(kind.rfind('.') + 1) +
           ": scripted batch norm updates its running statistics per micro-batch, not once per step; write the "
           "network as a layer list (model.family \"layers\"), whose batch norm defers them";
  for (const auto& c : m.named_children()) {
    std::string why = refused_kind(c.value, path + "." + c.name);
    if (!why.empty()) return why;
  }
  return "";
}

// The line of a libtorch or TorchScript error that says what went wrong: the interpreter's
// message is a traceback whose last "...Error: ..." line is the cause; others say it first.
std::string cause_of(const std::exception& e) {
  const auto* c = dynamic_cast<const c10::Error*>(&e);
  const std::string text = c ? c->what_without_backtrace() : e.what();
  std::string cause = text.substr(0, text.find('\n'));
  size_t at = 0;
  while (at < text.size()) {
    const size_t nl = text.find('\n', at);
    const std::string line = text.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    if (line.find("Error: ") != std::string::npos) cause = line;
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  return printable(cause, 200);
}

}  // namespace

Model build_torchscript(JsonReader& r) {
  const std::string path = r.get_string("path", "");
  if (path.empty()) r.fail("path", "is required: a file saved by torch.jit.script(model).save(path) or a traced model");
  Model m;
  read_input(r, m);
  torch::jit::Module loaded;
  try {
    loaded = torch::jit::load(path, torch::kCPU);
  } catch (const std::exception& e) {
    r.fail("path", "cannot load '" + printable(path, 200) + "' as TorchScript: " + cause_of(e));
  }
  // Plain interpretation: no profiling-driven fusion, so a stage computes what one device does.
  torch::jit::setGraphExecutorOptimize(false);
  const std::string refused = refused_kind(loaded, path);
  if (!refused.empty()) r.fail("path", refused);
  m.layers = torch::nn::Sequential();
  for (const auto& c : loaded.named_children()) m.layers->push_back(std::string(c.name), ScriptLayer(c.value));
  if (m.layers->size() == 0)
    r.fail("path", "'" + printable(path, 200) + "' has no submodules to split: save a torch.nn.Sequential (its children "
                   "are the layers)");
  // The class count: one sample through the whole list, without gradients.
  try {
    torch::NoGradGuard no_grad;
    std::vector<int64_t> shape{1};
    shape.insert(shape.end(), m.sample_shape.begin(), m.sample_shape.end());
    at::Tensor x = m.token_input ? torch::zeros(shape, torch::kLong) : torch::zeros(shape, loaded.parameters().size() ? (*loaded.parameters().begin()).scalar_type() : at::kFloat);
    m.layers->eval();
    for (auto& layer : *m.layers) x = layer.forward(x);
    m.layers->train();
    if (x.dim() < 2) r.fail("path", "the model gives " + std::to_string(x.dim()) + "-D output for a batch; it must give class scores");
    m.classes = x.size(-1);
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    r.fail("input_shape", "a sample of this shape does not go through '" + printable(path, 200) + "': " + cause_of(e));
  }
  return m;
}

}  // namespace pipetrain::models
