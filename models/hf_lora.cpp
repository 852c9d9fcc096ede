// LoRA fine-tuning of the `hf` family (models/hf_lora.h).
#include "models/hf_lora.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <set>
#include <vector>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/strings.h"
#include "models/safetensors.h"

namespace pipetrain::models {

using nlohmann::json;

namespace {
// An adapter's adapter_config.json: what PEFT wrote, every field that would change the math checked.
void read_adapter_config(HfLora& h) {
  const std::string file = h.path + "/adapter_config.json";
  std::ifstream in(file);
  if (!in) throw ConfigError(detail::concat(h.where, ": ", h.path, " has no adapter_config.json (a directory PEFT's save_pretrained wrote)"));
  std::ostringstream text;
  text << in.rdbuf();
  const json c = parse_unique_json(text.str(), file);
  auto bad = [&](const std::string& what) { throw ConfigError(detail::concat(file, ": ", what)); };
  if (!c.is_object() || c.value("peft_type", "") != "LORA") bad("peft_type is not \"LORA\"");
  auto number = [&](const char* key, double def) {
    if (!c.contains(key) || c[key].is_null()) return def;
    if (!c[key].is_number()) bad(detail::concat(key, " is not a number"));
    return c[key].get<double>();
  };
  const double r = number("r", 8);
  if (r < 1 || r > (1 << 16) || r != std::floor(r)) bad("r must be an integer from 1 to 65536");
  h.lora.rank = static_cast<int64_t>(r);
  h.lora.alpha = number("lora_alpha", 8);
  h.lora.dropout = number("lora_dropout", 0);
  if (h.lora.alpha <= 0 || h.lora.dropout < 0 || h.lora.dropout > 0.99) bad("lora_alpha must be above 0 and lora_dropout in [0, 0.99]");
  h.lora.rslora = c.value("use_rslora", false);
  for (const char* key : {"use_dora", "fan_in_fan_out", "use_qalora"})
    if (c.value(key, false)) bad(detail::concat(key, " true is not supported (plain LoRA adapters alone)"));
  if (c.value("bias", "none") != "none") bad("bias other than \"none\" is not supported (the adapters train no biases)");
  for (const char* key : {"modules_to_save", "layers_to_transform", "layers_pattern", "trainable_token_indices", "target_parameters"})
    if (c.contains(key) && !c[key].is_null() && !(c[key].is_array() && c[key].empty()))
      bad(detail::concat(key, " is not supported (adapters beside every targeted projection, nothing else trained)"));
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (c.contains(key) && !c[key].is_null() && !(c[key].is_object() && c[key].empty()))
      bad(detail::concat(key, " is not supported (one rank and alpha for every adapter)"));
  const json t = c.value("target_modules", json());
  if (t.is_string()) h.modules = {t.get<std::string>()};
  else if (t.is_array())
    for (const json& m : t)
      if (m.is_string()) h.modules.push_back(m.get<std::string>());
  if (h.modules.empty()) bad("target_modules names no module");
}
}  // namespace

HfLora read_hf_lora(JsonReader& model) {
  HfLora h;
  if (!model.has("lora")) return h;
  h.where = model.where("lora");
  JsonReader r = model.child("lora");
  h.path = r.get_string("path", "");
  if (!h.path.empty()) {
    for (const char* key : {"rank", "alpha", "rslora", "targets"})
      if (r.has(key)) r.fail(key, "is the adapter's (path's adapter_config.json)");
    read_adapter_config(h);
    h.lora.dropout = r.get_number("dropout", h.lora.dropout, 0.0, 0.99);  // training's may differ
  } else {
    h.lora.rank = r.require_int("rank", 1, 1 << 16);
    h.lora.alpha = r.get_number("alpha", 8.0, 1e-6, 1e6);
    h.lora.dropout = r.get_number("dropout", 0.0, 0.0, 0.99);
    h.lora.rslora = r.get_bool("rslora", false);
    h.lora.targets = read_lora_targets(r, "targets").names;
  }
  r.finish();
  return h;
}

namespace {
// The projections a llama_block's arguments give it, of `wanted` (the rules of read_llama_block).
std::vector<std::string> has(const json& block, const std::vector<std::string>& wanted) {
  auto positive = [&](const char* key) { return block.contains(key) && block[key].is_number() && block[key].get<double>() > 0; };
  const bool attention = block.value("mixer", true) && !positive("kv_lora_rank") && !positive("mamba_heads") && !positive("linear_key_heads");
  const bool mlp = block.value("mlp", true) && !positive("experts");
  std::vector<std::string> out;
  for (const std::string& t : wanted) {
    const bool here = t == "gate_proj" ? mlp && block.value("mlp_gate", true) : t == "up_proj" || t == "down_proj" ? mlp : attention;
    if (here) out.push_back(t);
  }
  return out;
}

std::string last_part(const std::string& name) {  // "a.b.q_proj.weight" -> "q_proj"
  const std::string module = name.substr(0, name.rfind('.'));
  return module.substr(module.rfind('.') + 1);
}
bool plain(const HfTensor& t) { return t.rows == 0 && t.slice < 0 && !t.transposed && t.ours_row < 0; }
}  // namespace

void add_hf_lora(HfLora& h, HfSpec& spec) {
  Lora& lora = h.lora;
  if (lora.rank == 0) return;
  if (!h.path.empty()) {  // the adapter's target_modules, by the checkpoint's names, as our projections
    std::set<std::string> ours;
    for (const std::string& m : h.modules) {
      bool found = false;
      for (const HfTensor& t : spec.tensors) {
        const auto& names = lora_target_names();
        if (!plain(t) || last_part(t.theirs) != m || std::find(names.begin(), names.end(), last_part(t.ours)) == names.end()) continue;
        ours.insert(last_part(t.ours));
        found = true;
      }
      if (!found)
        throw ConfigError(detail::concat(h.where, ": the adapter ", h.path, " targets '", m, "', which is no projection of ", spec.architecture,
                                         " that the adapters go beside (a llama_block's attention or dense MLP, not a fused tensor)"));
    }
    for (const std::string& n : lora_target_names())
      if (ours.count(n)) lora.targets.push_back(n);
  }
  bool any_block = false, any = false;
  for (json& layer : spec.layers["layers"]) {
    if (layer.value("type", "") != "llama_block") continue;
    any_block = true;
    const std::vector<std::string> targets = has(layer, lora.targets);
    if (targets.empty()) continue;
    any = true;
    layer["lora_rank"] = lora.rank;
    layer["lora_alpha"] = lora.alpha;
    layer["lora_dropout"] = lora.dropout;
    layer["lora_rslora"] = lora.rslora;
    layer["lora_targets"] = targets;
  }
  if (!any_block)
    throw ConfigError(detail::concat(h.where, ": ", spec.architecture, " has no llama_block layers, beside whose projections the adapters go"));
  if (!any)
    throw ConfigError(detail::concat(h.where, ": no layer of ", spec.architecture, " has a projection the targets name (", join(lora.targets, ", "), ")"));
}

void load_hf_adapter(const HfLora& h, const HfSpec& spec, torch::nn::Module& layers) {
  if (h.path.empty()) return;
  const std::string file = h.path + "/adapter_model.safetensors";
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0)
    throw ConfigError(detail::concat(h.where, ": ", h.path, " has no adapter_model.safetensors (PEFT's save_pretrained writes one)"));
  const SafetensorsFile adapter(file);
  std::map<std::string, std::string> ours_of;  // the checkpoint's module -> our projection's name, both without ".weight"
  for (const HfTensor& t : spec.tensors)
    if (plain(t)) ours_of[t.theirs.substr(0, t.theirs.rfind('.'))] = t.ours.substr(0, t.ours.rfind('.'));
  auto params = layers.named_parameters();
  std::set<std::string> given;
  torch::NoGradGuard no_grad;
  for (const std::string& name : adapter.names()) {
    const std::string prefix = "base_model.model.";
    const size_t n = std::string(".lora_A.weight").size(), at = name.size() - n;
    const bool under = name.size() > prefix.size() + n && name.rfind(prefix, 0) == 0;
    const bool a = under && name.compare(at, n, ".lora_A.weight") == 0, b = under && name.compare(at, n, ".lora_B.weight") == 0;
    const std::string module = a || b ? name.substr(prefix.size(), at - prefix.size()) : "";
    const auto it = ours_of.find(module);
    const at::Tensor* p = it == ours_of.end() ? nullptr : params.find(it->second + (a ? ".lora_A.weight" : ".lora_B.weight"));
    if (!p) throw ConfigError(detail::concat(file, ": tensor '", name, "' is no adapter of this model's projections"));
    const at::Tensor w = adapter.get(name);
    if (w.sizes() != p->sizes() || !w.is_floating_point())
      throw ConfigError(detail::concat(file, ": tensor '", name, "' is ", w.scalar_type(), " ", w.sizes(), ", the adapter ", p->sizes()));
    p->copy_(w);
    given.insert(it->second + (a ? ".lora_A.weight" : ".lora_B.weight"));
  }
  for (const auto& p : params)
    if (is_adapter(p.key()) && !given.count(p.key()))
      throw ConfigError(detail::concat(file, ": no tensor for the adapter ", p.key(), " (the adapter_config.json's targets, every layer's)"));
}

bool is_adapter(const std::string& name) {
  auto ends = [&](const std::string& s) { return name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0; };
  return ends(".lora_A.weight") || ends(".lora_B.weight");
}

void freeze_all_but_adapters(torch::nn::Module& layers) {
  for (auto& p : layers.named_parameters())
    if (!is_adapter(p.key())) p.value().requires_grad_(false);
}

namespace {
constexpr const char* kA = ".lora_A.weight";
constexpr const char* kB = ".lora_B.weight";

std::string base_of(const std::string& a) { return a.substr(0, a.size() - std::string(kA).size()); }

// The section's "lora" as it was read when the model was built.
Lora lora_of(const json& model, const std::string& what) {
  json section = model;
  JsonReader r(section, "model", what);
  return read_hf_lora(r).lora;
}
}  // namespace

void merge_adapters(std::map<std::string, at::Tensor>& weights, const json& model) {
  if (!model.contains("lora")) return;
  const Lora lora = lora_of(model, "the model's config");
  std::vector<std::string> adapters;
  for (const auto& [name, t] : weights)
    if (name.size() > std::string(kA).size() && name.compare(name.size() - std::string(kA).size(), std::string(kA).size(), kA) == 0)
      adapters.push_back(name);
  for (const std::string& a : adapters) {
    const std::string base = base_of(a), w = base + ".weight", b = base + kB;
    if (!weights.count(w) || !weights.count(b)) throw ConfigError("export: the adapter " + a + " has no " + (weights.count(w) ? b : w));
    const at::Tensor W = weights.at(w);
    const at::Tensor delta = at::matmul(weights.at(b).to(at::kDouble), weights.at(a).to(at::kDouble)) * lora.scaling();
    if (delta.sizes() != W.sizes()) throw ConfigError(detail::concat("export: the adapter of ", w, " makes ", delta.sizes(), ", the weight is ", W.sizes()));
    weights[w] = (W.to(at::kDouble) + delta).to(W.scalar_type());
    weights.erase(a);
    weights.erase(b);
  }
}

size_t save_peft(const std::string& source, const std::map<std::string, at::Tensor>& weights, const json& model,
                 const std::string& out) {
  if (!model.contains("lora")) throw ConfigError("export --format peft: the model was trained without \"lora\": it has no adapters to write");
  const Lora lora = lora_of(model, "the model's config");
  const HfSpec spec = read_hf_spec(source, 1, "export --format peft");
  std::map<std::string, const HfTensor*> by_ours;
  for (const HfTensor& t : spec.tensors) by_ours[t.ours] = &t;
  NamedTensors tensors;
  std::set<std::string> modules;
  for (const auto& [name, t] : weights) {
    if (!is_adapter(name)) continue;
    const bool is_a = name.compare(name.size() - std::string(kA).size(), std::string(kA).size(), kA) == 0;
    const std::string base = name.substr(0, name.size() - std::string(kA).size()) + ".weight";
    const auto it = by_ours.find(base);
    if (it == by_ours.end()) throw ConfigError(detail::concat("export --format peft: the adapter ", name, " adapts ", base, ", which ", source, " does not hold"));
    const HfTensor& h = *it->second;
    if (h.rows > 0 || h.slice >= 0 || h.transposed || h.ours_row >= 0)
      throw ConfigError(detail::concat("export --format peft: ", base, " is part of the checkpoint's fused tensor '", h.theirs,
                                       "', which no PEFT adapter of ", spec.architecture, "'s modules expresses (export --format hf merges it)"));
    const std::string module = h.theirs.substr(0, h.theirs.size() - std::string(".weight").size());
    modules.insert(module.substr(module.rfind('.') + 1));
    tensors.emplace_back("base_model.model." + module + (is_a ? ".lora_A.weight" : ".lora_B.weight"), t.detach().cpu().contiguous());
  }
  if (tensors.empty()) throw ConfigError("export --format peft: the weights hold no adapters");
  ::mkdir(out.c_str(), 0777);
  struct stat st {};
  if (::stat(out.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) throw ConfigError("export --format peft: cannot make the directory " + out);
  save_safetensors(out + "/adapter_model.safetensors", tensors, {{"format", "pt"}});
  const json config{{"peft_type", "LORA"},
                    {"task_type", "CAUSAL_LM"},
                    {"base_model_name_or_path", source},
                    {"r", lora.rank},
                    {"lora_alpha", lora.alpha},
                    {"lora_dropout", lora.dropout},
                    {"use_rslora", lora.rslora},
                    {"target_modules", std::vector<std::string>(modules.begin(), modules.end())},
                    {"bias", "none"},
                    {"fan_in_fan_out", false},
                    {"modules_to_save", nullptr},
                    {"init_lora_weights", true},
                    {"use_dora", false},
                    {"inference_mode", true}};
  const std::string text = config.dump(2) + "\n";
  write_file_atomically(out + "/adapter_config.json", text.data(), text.size());
  return tensors.size();
}

}  // namespace pipetrain::models
