// layers: a network written in the config as an ordered list of named layers (GPipe's own
// interface, Keras' and DeepSpeed's LayerSpec): PyTorch's module names in lower case and its
// constructor arguments' names, skips by name (stash on any layer, merged by add or concat, across
// stages through models/skip.h), blocks repeated, several operations as one layer (sequential),
// parameters tied by name. The types and their arguments are the rows of models/layer_table.h;
// each layer's output shape is worked out when the model is built, so a mismatch names the layer
// and both shapes. docs/models.md lists every type with an example.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <torch/torch.h>

#include "common/error.h"
#include "common/strings.h"
#include "models/families.h"
#include "models/incremental.h"
#include "models/layer_table.h"
#include "models/skip.h"

namespace pipetrain::models {

namespace {

// One operation of a list layer: its module (registered under `module`; "" registers the module's
// own parameters and children under the layer itself), how it runs, then the skip it merges.
struct Part {
  std::string module;
  Make make;
  Run run;
  Step step;  // none: the operation cannot run on the next positions alone
  std::string pop;
  bool concat = false;
  int64_t concat_dim = 1;
  std::vector<std::string> stashes, pops;  // of the part and any list nested in it
};

// One layer of a list: its operations in order (one, or a sequential's), then the skip it stashes
// its output under. Parameters are "<layer>.<module>.<PyTorch's name>".
class ListLayerImpl : public torch::nn::Cloneable<ListLayerImpl>, public SkipDeclaring, public IncrementalLayer {
 public:
  ListLayerImpl(std::vector<Part> parts, std::string stash) : parts_(std::move(parts)), stash_(std::move(stash)) { reset(); }
  void reset() override {
    ops_.clear();
    for (const Part& p : parts_) {
      std::shared_ptr<torch::nn::Module> op = p.make ? p.make() : nullptr;
      if (op && p.module.empty()) adopt(*op);
      else if (op) register_module(p.module, op);
      ops_.push_back(op);
    }
  }
  void train(bool on) override {
    torch::nn::Module::train(on);
    for (size_t i = 0; i < parts_.size(); ++i)
      if (ops_[i] && parts_[i].module.empty()) ops_[i]->train(on);  // adopted: not a child
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x;
    for (size_t i = 0; i < parts_.size(); ++i) h = merge(parts_[i], parts_[i].run(ops_[i].get(), h));
    return finish(h);
  }
  bool incremental() const override {
    return std::all_of(parts_.begin(), parts_.end(), [](const Part& p) { return static_cast<bool>(p.step); });
  }
  at::Tensor forward_at(const at::Tensor& x, int64_t offset, KvCache& cache) override {
    PIPETRAIN_CHECK(incremental());
    at::Tensor h = x;
    for (size_t i = 0; i < parts_.size(); ++i) h = merge(parts_[i], parts_[i].step(ops_[i].get(), h, offset, cache));
    return finish(h);
  }
  std::vector<std::string> stashes() const override {
    std::vector<std::string> s;
    for (const Part& p : parts_) s.insert(s.end(), p.stashes.begin(), p.stashes.end());
    if (!stash_.empty()) s.push_back(stash_);
    return s;
  }
  std::vector<std::string> pops() const override {
    std::vector<std::string> s;
    for (const Part& p : parts_) s.insert(s.end(), p.pops.begin(), p.pops.end());
    return s;
  }

 private:
  // The module's parameters, buffers and children as the layer's own (a preset's names).
  void adopt(torch::nn::Module& op) {
    for (const auto& c : op.named_children()) register_module(c.key(), c.value());
    for (const auto& p : op.named_parameters(/*recurse=*/false)) register_parameter(p.key(), p.value(), p.value().requires_grad());
    for (const auto& b : op.named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
  }
  at::Tensor merge(const Part& p, at::Tensor h) {
    if (p.pop.empty()) return h;
    const at::Tensor other = pop(p.pop);
    return p.concat ? torch::cat({h, other.to(h.scalar_type())}, p.concat_dim) : h + other;
  }
  at::Tensor finish(at::Tensor h) {
    if (!stash_.empty()) stash(stash_, h);
    return h;
  }

  std::vector<Part> parts_;
  std::string stash_;
  std::vector<std::shared_ptr<torch::nn::Module>> ops_;
};
TORCH_MODULE(ListLayer);

bool valid_name(const std::string& n) {
  return !n.empty() && n.size() <= 64 &&
         std::all_of(n.begin(), n.end(), [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; });
}

constexpr size_t kMaxLayers = 4096;  // as the families' layer counts: far beyond any pipeline's stages
constexpr double kMaxSampleValues = double(int64_t{1} << 40);  // one sample's values at any layer

// The machine's memory in float32 values: what a list's parameters may reach when it is built.
double memory_values() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) / 4.0 : 1e12;
}
double& limit_of_parameters() {
  static double limit = memory_values();
  return limit;
}

// One sample's shape at a layer: at most kMaxSampleValues values, so no product of its sizes
// overflows.
void check_volume(const LayerContext& c, const Shape& s) {
  double n = 1;
  for (int64_t d : s) n *= double(d);
  if (n > kMaxSampleValues) c.fail(detail::concat("gives samples of ", shape_text(s), ": more than 2^40 values each"));
}

std::string bytes_text(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  for (; b >= 1024 && u < 6; ++u) b /= 1024;
  return detail::concat(std::round(b * 10) / 10, " ", units[u]);
}

// Builds the list in order: the layers, shapes, skips and names.
struct ListBuilder {
  Model& m;
  Shape shape;
  bool tokens;
  uint64_t stream = 0;
  std::map<std::string, Shape> open_skips;  // stashed, not yet merged: their shapes
  std::set<std::string> names;
  double params = 0;  // the values of the layers' parameters and buffers so far

  static const LayerType& read_type(JsonReader& r, const nlohmann::json& raw) {
    const std::string type = r.get_choice("type", "", layer_type_names());
    if (type.empty()) r.fail("type", "is required; one of: " + join(layer_type_names(), ", "));
    const LayerType& t = *find_layer_type(type);
    check_layer_args(r, raw, t);
    return t;
  }

  void add(JsonReader& r, const nlohmann::json& raw, const std::string& suffix, int depth) {
    const LayerType& t = read_type(r, raw);
    if (t.name == "repeat") {  // the block's layers, `count` times, their names numbered (fc_0, fc_1, ...)
      if (depth >= 4) r.fail("type", "repeat nested more than 4 deep");
      const int64_t count = r.require_int("count", 1, 4096);
      const nlohmann::json& inner = *r.get_raw("layers");
      if (r.objects("layers").empty()) r.fail("layers", "is required: the block to repeat, a list of layers");
      for (int64_t i = 0; i < count; ++i) {
        std::vector<JsonReader> block = r.objects("layers");
        for (size_t j = 0; j < block.size(); ++j) add(block[j], inner[j], suffix + "_" + std::to_string(i), depth + 1);
      }
      r.finish();
      return;
    }
    if (m.layers->size() >= kMaxLayers)
      r.fail("type", detail::concat("the list makes more than ", kMaxLayers, " layers (after repeats)"));
    std::string name = r.get_string("name", "");
    if (!valid_name(name)) r.fail("name", "is required: letters, digits and _ (at most 64), unique in the list");
    name += suffix;
    if (!names.insert(name).second) r.fail("name", "'" + name + "' names another layer already");
    const std::string stash_name = r.get_string("stash", "");
    std::vector<Part> parts;
    if (t.name == "sequential") {
      if (r.has("module")) r.fail("module", "names the module of one operation; a sequential's operations name theirs");
      parts = sequence(r, name, depth);
    } else {
      parts.push_back(part(r, t, name, nullptr, depth));
    }
    if (!stash_name.empty()) {
      if (!valid_name(stash_name)) r.fail("stash", "letters, digits and _ (at most 64)");
      if (open_skips.count(stash_name)) r.fail("stash", "'" + stash_name + "' is stashed already and not yet merged");
      open_skips[stash_name] = shape;
    }
    r.finish();
    m.layers->push_back(std::string(name), ListLayer(std::move(parts), stash_name));
  }

  // A sequential's operations, each with a module name of its own within the layer.
  std::vector<Part> sequence(JsonReader& r, const std::string& name, int depth) {
    if (depth >= 4) r.fail("type", "sequential nested more than 4 deep");
    const nlohmann::json* raw = r.get_raw("layers");
    std::vector<JsonReader> inner = r.objects("layers");
    if (inner.empty()) r.fail("layers", "is required: the layer's operations, a list of layers");
    std::set<std::string> modules;
    std::vector<Part> parts;
    for (size_t i = 0; i < inner.size(); ++i) {
      JsonReader& e = inner[i];
      const LayerType& t = read_type(e, (*raw)[i]);
      if (t.name == "repeat") e.fail("type", "repeat the sequential instead of repeating inside it");
      if (e.has("stash")) e.fail("stash", "stash the sequential's output, not an operation's inside it");
      const std::string label = name + "." + e.get_string("name", t.name);  // for messages only
      parts.push_back(part(e, t, label, &modules, depth + 1));
      e.finish();
    }
    return parts;
  }

  // The module name of an operation: `module`, else its type's; "" (the layer's own) for a layer
  // of one operation only. Unique within a sequential (`modules`, null outside one).
  std::string module_of(JsonReader& r, const LayerType& t, const std::string& short_name, bool has_module,
                        std::set<std::string>* modules) {
    if (!has_module) {
      if (r.has("module")) r.fail("module", t.name + " has no parameters to name");
      return "";
    }
    const std::string name = r.get_string("module", short_name);
    if (name.empty() && modules) r.fail("module", "\"\" (the layer's own names) is for a layer of one operation, not inside a sequential");
    if (!name.empty() && !valid_name(name)) r.fail("module", "letters, digits and _ (at most 64)");
    if (modules && !modules->insert(name).second)
      r.fail("module", "'" + name + "' names another operation of this sequential already; give each its own \"module\"");
    return name;
  }

  // One operation: read, checked against the shape so far, which it advances.
  Part part(JsonReader& r, const LayerType& t, const std::string& name, std::set<std::string>* modules, int depth) {
    LayerContext c{r, name, t.name, shape, tokens, stream};
    Part p;
    Shape out = shape;
    if (t.name == "add" || t.name == "concat") {
      out = merge(c, p);
    } else if (t.name == "sequential") {
      std::vector<Part> inner = sequence(r, name, depth);
      out = shape;
      p.module = module_of(r, t, "seq", true, modules);
      if (p.module.empty()) r.fail("module", "\"\" is for a layer of one operation");
      for (const Part& q : inner) {
        p.stashes.insert(p.stashes.end(), q.stashes.begin(), q.stashes.end());
        p.pops.insert(p.pops.end(), q.pops.begin(), q.pops.end());
      }
      p.make = [inner] { return ListLayer(inner, "").ptr(); };
      p.run = [](torch::nn::Module* op, const at::Tensor& x) { return static_cast<ListLayerImpl*>(op)->forward(x); };
      if (std::all_of(inner.begin(), inner.end(), [](const Part& q) { return static_cast<bool>(q.step); }))
        p.step = [](torch::nn::Module* op, const at::Tensor& x, int64_t offset, KvCache& cache) {
          return static_cast<ListLayerImpl*>(op)->forward_at(x, offset, cache);
        };
    } else {
      if (tokens && t.name != "embedding") c.fail("gets token ids: only an embedding takes them");
      Built b = t.build(c);
      p.module = module_of(r, t, b.module_name, static_cast<bool>(b.make), modules);
      p.make = b.make;
      p.run = b.run;
      p.step = b.step;
      if (!p.step && b.per_position)
        p.step = [run = b.run](torch::nn::Module* op, const at::Tensor& x, int64_t, KvCache&) { return run(op, x); };
      params += b.params;  // checked before the layer's tensors are made
      if (params > parameter_limit())
        c.fail(detail::concat("brings the model to ", params, " parameter values (", bytes_text(4 * params),
                              " in float32), more than this machine's memory holds (", bytes_text(4 * parameter_limit()), ")"));
      stream += static_cast<uint64_t>(b.random_streams);
      out = b.out;
    }
    check_volume(c, out);
    shape = out;
    tokens = false;
    return p;
  }

  // add or concat: pops the skip named by `from`, checked against the shape so far.
  Shape merge(const LayerContext& c, Part& p) {
    JsonReader& r = c.r;
    p.pop = r.get_string("from", "");
    auto it = open_skips.find(p.pop);
    if (it == open_skips.end())
      r.fail("from", p.pop.empty() ? "is required: the name a layer before stashed its output under"
                                   : "'" + p.pop + "' is not stashed by a layer before this one (or was merged already)");
    const Shape& other = it->second;
    Shape out = shape;
    p.run = [](torch::nn::Module*, const at::Tensor& x) { return x; };
    bool per_position = true;
    if (c.type == "add") {
      if (other != shape) c.fail(detail::concat("adds ", p.pop, " of ", shape_text(other), " to ", shape_text(shape)));
    } else {
      p.concat = true;
      const int64_t d = c.sample_dim(r.get_int("dim", 1, -64, 64), "dim");
      p.concat_dim = d + 1;
      per_position = d >= 1;
      Shape a = shape, o = other;
      if (a.size() != o.size()) c.fail(detail::concat("concatenates ", p.pop, " of ", shape_text(other), " to ", shape_text(shape)));
      a[static_cast<size_t>(d)] = o[static_cast<size_t>(d)] = 0;
      if (a != o) c.fail(detail::concat("concatenates ", p.pop, " of ", shape_text(other), " to ", shape_text(shape), " along dim ", d + 1));
      out[static_cast<size_t>(d)] += other[static_cast<size_t>(d)];
    }
    if (per_position) p.step = [](torch::nn::Module*, const at::Tensor& x, int64_t, KvCache&) { return x; };
    p.pops = {p.pop};
    open_skips.erase(it);
    return out;
  }
};

}  // namespace

void read_input(JsonReader& r, Model& m) {
  const std::vector<double> input = r.get_numbers("input_shape", {});
  if (input.empty()) r.fail("input_shape", "is required: one sample's shape without the batch, e.g. [1, 28, 28]");
  for (double d : input) {
    if (d < 1 || d > double(int64_t{1} << 30) || d != static_cast<double>(static_cast<int64_t>(d)))
      r.fail("input_shape", "expected positive integers");
    m.sample_shape.push_back(static_cast<int64_t>(d));
  }
  m.token_input = r.get_choice("input_dtype", "float", {"float", "long"}) == "long";
  double n = 1;
  for (int64_t d : m.sample_shape) n *= double(d);
  if (n > kMaxSampleValues) r.fail("input_shape", "more than 2^40 values per sample");
}

void set_parameter_limit(double values) { limit_of_parameters() = values; }
double parameter_limit() { return limit_of_parameters(); }

Model build_layer_list(JsonReader& r) {
  Model m;
  m.layers = torch::nn::Sequential();
  read_input(r, m);
  ListBuilder b{m, m.sample_shape, m.token_input, 0, {}, {}, 0};
  std::vector<JsonReader> layers = r.objects("layers");
  if (layers.empty()) r.fail("layers", "is required: a list of layers, each {\"name\": ..., \"type\": ...}");
  const nlohmann::json& raw = *r.get_raw("layers");
  for (size_t i = 0; i < layers.size(); ++i) b.add(layers[i], raw[i], "", 0);
  if (!b.open_skips.empty())
    r.fail("layers", "'" + b.open_skips.begin()->first + "' is stashed and never merged (add or concat with \"from\")");
  if (b.shape.empty()) r.fail("layers", "the last layer gives a scalar per sample; it must give class scores");
  m.classes = b.shape.back();
  // Ties by the parameters' full names: "<layer>.<module>.<parameter>".
  const nlohmann::json* ties = r.get_raw("ties");
  if (ties && !ties->is_array()) r.fail("ties", "expected a list of lists of parameter names");
  const auto all = m.layers->named_parameters();
  for (size_t t = 0; ties && t < ties->size(); ++t) {
    const auto& group = (*ties)[t];
    const std::string key = "ties[" + std::to_string(t) + "]";
    if (!group.is_array() || group.size() < 2) r.fail(key, "expected a list of at least two parameter names");
    Tie tie;
    at::Tensor first;
    for (const auto& e : group) {
      const std::string full = e.is_string() ? e.get<std::string>() : "";
      const size_t dot = full.find('.');
      if (!all.contains(full) || dot == std::string::npos)
        r.fail(key, "'" + full + "' is not a parameter of the model (names are <layer>.<module>.<parameter>, e.g. " +
                        (all.is_empty() ? std::string("head.linear.weight") : all.begin()->key()) + ")");
      for (const ParamRef& p : tie)
        if (full == layer_names(m.layers)[static_cast<size_t>(p.layer)] + "." + p.name) r.fail(key, "names '" + full + "' twice");
      const std::string layer = full.substr(0, dot);
      const auto names = layer_names(m.layers);
      const int index = static_cast<int>(std::find(names.begin(), names.end(), layer) - names.begin());
      const at::Tensor p = all[full];
      if (first.defined() && p.sizes() != first.sizes())
        r.fail(key, detail::concat("'", full, "' has shape ", p.sizes(), ", the first of the tie ", first.sizes()));
      if (!first.defined()) first = p;
      tie.push_back({index, full.substr(dot + 1)});
    }
    torch::NoGradGuard no_grad;
    for (size_t i = 1; i < tie.size(); ++i) all[detail::concat(layer_names(m.layers)[tie[i].layer], ".", tie[i].name)].copy_(first);
    m.ties.push_back(tie);
  }
  return m;
}

Model build_spelled_list(const nlohmann::json& model, const std::string& source) {
  KeysUnrecorded unrecorded;  // the preset's keys were recorded where its config was read
  JsonReader r(model, "model", source);
  Model m = build_layer_list(r);
  r.finish();
  return m;
}

}  // namespace pipetrain::models
