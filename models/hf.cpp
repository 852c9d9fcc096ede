#include "models/hf.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include <torch/torch.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/strings.h"
#include "models/families.h"

namespace pipetrain::models {

namespace {

using json = nlohmann::json;

const std::string kLlama = "LlamaForCausalLM", kMistral = "MistralForCausalLM", kQwen2 = "Qwen2ForCausalLM",
                  kQwen3 = "Qwen3ForCausalLM", kPhi3 = "Phi3ForCausalLM", kGpt2 = "GPT2LMHeadModel";

std::string read_text(const std::string& path, const std::string& where) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(where + ": cannot read " + path + " (a directory written by save_pretrained has it)");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// config.json's fields, each checked for its type; a problem names the file and the field.
class Fields {
 public:
  Fields(const json& j, std::string where) : j_(j), where_(std::move(where)) {}
  [[noreturn]] void fail(const std::string& key, const std::string& msg) const { throw ConfigError(where_ + ": " + key + " " + msg); }
  bool has(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const json& at(const std::string& key) const { return j_.at(key); }
  int64_t integer(const std::string& key, int64_t def, int64_t min, int64_t max, bool required = false) const {
    if (!has(key)) {
      if (required) fail(key, "is missing");
      return def;
    }
    const json& v = j_.at(key);
    if (!v.is_number_integer()) fail(key, "must be an integer, got " + v.dump());
    const int64_t x = v.get<int64_t>();
    if (x < min || x > max) fail(key, detail::concat("must be in [", min, ", ", max, "], got ", x));
    return x;
  }
  double number(const std::string& key, double def) const {
    if (!has(key)) return def;
    const json& v = j_.at(key);
    if (!v.is_number()) fail(key, "must be a number, got " + v.dump());
    return v.get<double>();
  }
  bool boolean(const std::string& key, bool def) const {
    if (!has(key)) return def;
    if (!j_.at(key).is_boolean()) fail(key, "must be true or false, got " + j_.at(key).dump());
    return j_.at(key).get<bool>();
  }
  std::string string(const std::string& key, const std::string& def) const {
    if (!has(key)) return def;
    if (!j_.at(key).is_string()) fail(key, "must be a string, got " + j_.at(key).dump());
    return j_.at(key).get<std::string>();
  }
  // A field the supported math needs at this value (or absent).
  void require(const std::string& key, const json& value, const std::string& why) const {
    if (has(key) && j_.at(key) != value) fail(key, j_.at(key).dump() + " is not supported (" + why + ")");
  }

 private:
  const json& j_;
  std::string where_;
};

std::string architecture_of(const json& config, const Fields& f) {
  if (f.has("architectures")) {
    const json& a = f.at("architectures");
    if (!a.is_array() || a.size() != 1 || !a[0].is_string()) f.fail("architectures", "must list one architecture, got " + a.dump());
    const std::string name = a[0].get<std::string>();
    if (std::find(hf_architectures().begin(), hf_architectures().end(), name) == hf_architectures().end())
      f.fail("architectures", "'" + name + "' is not supported (" + join(hf_architectures(), ", ") + ")");
    return name;
  }
  static const std::map<std::string, std::string> by_type{{"llama", kLlama}, {"mistral", kMistral}, {"qwen2", kQwen2}, {"qwen3", kQwen3},
                                                                {"phi3", kPhi3}, {"gpt2", kGpt2}};
  const std::string type = f.string("model_type", "");
  const auto it = by_type.find(type);
  if (it == by_type.end()) f.fail("model_type", "'" + type + "' is not supported (llama, mistral, qwen2, qwen3, phi3, gpt2), and no architectures are named");
  (void)config;
  return it->second;
}

// transformers' rope parameters, old ("rope_theta", "rope_scaling") or new ("rope_parameters"),
// as a llama_block's rope_theta and rope_scaling.
void read_rope(const Fields& f, json& block) {
  const json none = json::object();
  const json& params = f.has("rope_parameters") ? f.at("rope_parameters") : f.has("rope_scaling") ? f.at("rope_scaling") : none;
  const std::string key = f.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (!params.is_object()) f.fail(key, "must be an object, got " + params.dump());
  const Fields p(params, "");
  auto get = [&](const std::string& k, double def) {
    if (!p.has(k)) return def;
    if (!params.at(k).is_number()) f.fail(key + "." + k, "must be a number");
    return params.at(k).get<double>();
  };
  const double theta = get("rope_theta", f.number("rope_theta", 10000.0));
  if (!(theta > 1)) f.fail("rope_theta", "must exceed 1");
  block["rope_theta"] = theta;
  const double partial = get("partial_rotary_factor", f.number("partial_rotary_factor", 1.0));
  if (partial != 1.0) f.fail("partial_rotary_factor", detail::concat(partial, " is not supported (rotary positions over the whole head)"));
  std::string type = "default";
  for (const char* k : {"rope_type", "type"})
    if (p.has(k)) {
      if (!params.at(k).is_string()) f.fail(key + "." + k, "must be a string");
      type = params.at(k).get<std::string>();
      break;
    }
  if (type != "default" && type != "linear" && type != "llama3")
    f.fail(key, "rope type '" + type + "' is not supported (default, linear, llama3)");
  if (type == "default") return;
  json s{{"rope_type", type}, {"factor", get("factor", 1.0)}};
  if (type == "llama3") {
    s["low_freq_factor"] = get("low_freq_factor", 1.0);
    s["high_freq_factor"] = get("high_freq_factor", 4.0);
    const double original = get("original_max_position_embeddings",
                                double(f.integer("original_max_position_embeddings", f.integer("max_position_embeddings", 8192, 1, int64_t{1} << 30), 1, int64_t{1} << 30)));
    s["original_max_position_embeddings"] = static_cast<int64_t>(original);
  }
  block["rope_scaling"] = s;
}

// The output head (lm_head, tied to the token embedding `embed` when `tied`) after `layers`, and
// the list for windows of seq_len tokens.
void with_head(HfSpec& spec, json& layers, int64_t d, int64_t vocab, int64_t seq_len, bool tied, const std::string& embed) {
  layers.push_back({{"name", "lm_head"}, {"type", "linear"}, {"in_features", d}, {"out_features", vocab}, {"bias", false}});
  spec.tensors.push_back({"lm_head.linear.weight", "lm_head.weight"});
  spec.tied = tied;
  spec.layers = {{"input_shape", json::array({seq_len})}, {"input_dtype", "long"}, {"layers", layers}};
  if (tied) spec.layers["ties"] = json::array({json::array({embed, "lm_head.linear.weight"})});
}

// Llama, Mistral, Qwen2, Qwen3, Phi-3: embed, layer_0..n-1 (llama_block), norm, lm_head. Phi-3 is
// Llama's math with q, k and v in one tensor and gate and up in another.
void llama_family(const std::string& arch, const Fields& f, int64_t seq_len, HfSpec& spec) {
  const int64_t big = int64_t{1} << 30;
  const int64_t vocab = f.integer("vocab_size", 0, 1, big, true), d = f.integer("hidden_size", 0, 1, big, true);
  const int64_t n = f.integer("num_hidden_layers", 0, 1, 4096, true), heads = f.integer("num_attention_heads", 0, 1, 1 << 16, true);
  const int64_t kv = f.integer("num_key_value_heads", heads, 1, heads);
  if (heads % kv) f.fail("num_key_value_heads", detail::concat("must divide num_attention_heads (", heads, ")"));
  const int64_t ff = f.integer("intermediate_size", 0, 1, big, true);
  const std::string act = f.has("hidden_act") ? f.string("hidden_act", "silu") : f.string("hidden_activation", "silu");
  if (act != "silu") f.fail("hidden_act", "'" + act + "' is not supported (SwiGLU's silu)");
  for (const char* k : {"attention_dropout", "resid_pdrop", "embd_pdrop"})  // the last two Phi-3's
    if (f.number(k, 0.0) != 0.0) f.fail(k, "above 0 is not supported (set it to 0.0)");
  json block{{"type", "llama_block"}, {"d_model", d}, {"n_heads", heads}, {"n_kv_heads", kv}, {"d_ff", ff},
             {"eps", f.number("rms_norm_eps", 1e-6)}};
  if (f.has("head_dim")) block["head_dim"] = f.integer("head_dim", 0, 2, 1 << 16);
  else if (arch == kQwen3) block["head_dim"] = 128;  // Qwen3Config's default
  else if (d % heads) f.fail("num_attention_heads", detail::concat("must divide hidden_size (", d, ") when head_dim is not given"));
  read_rope(f, block);
  const bool attention_bias = (arch == kLlama || arch == kQwen3) && f.boolean("attention_bias", false);
  block["qkv_bias"] = arch == kQwen2 || attention_bias;
  block["o_bias"] = attention_bias;
  block["mlp_bias"] = arch == kLlama && f.boolean("mlp_bias", false);
  block["qk_norm"] = arch == kQwen3;
  // Sliding windows: Mistral's on every layer; Qwen2's and Qwen3's on the layers layer_types
  // names (or, in older configs, those from max_window_layers on when use_sliding_window).
  const bool qwen = arch == kQwen2 || arch == kQwen3;
  std::vector<int64_t> window(static_cast<size_t>(n), 0);
  const int64_t sliding = f.integer("sliding_window", 0, 1, big);
  if (arch == kMistral || arch == kPhi3) std::fill(window.begin(), window.end(), sliding);
  if (qwen && f.has("layer_types")) {
    const json& types = f.at("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != n) f.fail("layer_types", detail::concat("must list ", n, " layers"));
    for (int64_t i = 0; i < n; ++i) {
      const json& t = types[static_cast<size_t>(i)];
      if (t == "sliding_attention") {
        if (!sliding) f.fail("sliding_window", "is required by layer_types' sliding_attention");
        window[static_cast<size_t>(i)] = sliding;
      } else if (t != "full_attention") {
        f.fail("layer_types", "'" + t.dump() + "' is not supported (full_attention, sliding_attention)");
      }
    }
  } else if (qwen && f.boolean("use_sliding_window", false) && sliding) {
    for (int64_t i = f.integer("max_window_layers", 0, 0, 4096); i < n; ++i) window[static_cast<size_t>(i)] = sliding;
  }
  json layers = json::array();
  json embed{{"name", "embed"}, {"type", "embedding"}, {"num_embeddings", vocab}, {"embedding_dim", d}};
  // transformers' embedding takes pad_token_id as its padding_idx: that token's row takes no
  // gradient (negative counts from the end, as torch.nn.Embedding's does; beyond the vocabulary
  // transformers itself cannot build the model).
  if (f.has("pad_token_id")) {
    const int64_t pad = f.integer("pad_token_id", 0, -vocab, vocab - 1);
    embed["padding_idx"] = pad < 0 ? pad + vocab : pad;
  }
  layers.push_back(embed);
  spec.tensors.push_back({"embed.embedding.weight", "model.embed_tokens.weight"});
  for (int64_t i = 0; i < n; ++i) {
    json b = block;
    b["name"] = detail::concat("layer_", i);
    // A window as long as the sequence changes nothing.
    if (window[static_cast<size_t>(i)] > 0 && window[static_cast<size_t>(i)] < seq_len) b["sliding_window"] = window[static_cast<size_t>(i)];
    layers.push_back(b);
  }
  const bool qkv_bias = block["qkv_bias"], o_bias = block["o_bias"], mlp_bias = block["mlp_bias"], qk_norm = block["qk_norm"];
  const int64_t D = block.contains("head_dim") ? block["head_dim"].get<int64_t>() : d / heads;
  for (int64_t i = 0; i < n; ++i) {
    const std::string ours = detail::concat("layer_", i, ".llama."), theirs = detail::concat("model.layers.", i, ".");
    if (arch == kPhi3) {  // qkv_proj: q's rows, then k's, then v's; gate_up_proj: gate's, then up's
      const std::string qkv = theirs + "self_attn.qkv_proj.weight", gate_up = theirs + "mlp.gate_up_proj.weight";
      spec.tensors.push_back({ours + "self_attn.q_proj.weight", qkv, false, 0, heads * D});
      spec.tensors.push_back({ours + "self_attn.k_proj.weight", qkv, false, heads * D, kv * D});
      spec.tensors.push_back({ours + "self_attn.v_proj.weight", qkv, false, (heads + kv) * D, kv * D});
      spec.tensors.push_back({ours + "mlp.gate_proj.weight", gate_up, false, 0, ff});
      spec.tensors.push_back({ours + "mlp.up_proj.weight", gate_up, false, ff, ff});
      for (const char* s : {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.weight", "mlp.down_proj.weight"})
        spec.tensors.push_back({ours + s, theirs + s});
      continue;
    }
    std::vector<std::string> names{"input_layernorm.weight", "post_attention_layernorm.weight"};
    for (const char* p : {"q", "k", "v", "o"}) {
      names.push_back(detail::concat("self_attn.", p, "_proj.weight"));
      if (std::string(p) == "o" ? o_bias : qkv_bias) names.push_back(detail::concat("self_attn.", p, "_proj.bias"));
    }
    if (qk_norm) names.insert(names.end(), {"self_attn.q_norm.weight", "self_attn.k_norm.weight"});
    for (const char* p : {"gate", "up", "down"}) {
      names.push_back(detail::concat("mlp.", p, "_proj.weight"));
      if (mlp_bias) names.push_back(detail::concat("mlp.", p, "_proj.bias"));
    }
    for (const std::string& s : names) spec.tensors.push_back({ours + s, theirs + s});
  }
  layers.push_back({{"name", "norm"}, {"type", "rmsnorm"}, {"normalized_shape", d}, {"eps", f.number("rms_norm_eps", 1e-6)}});
  spec.tensors.push_back({"norm.rms.weight", "model.norm.weight"});
  with_head(spec, layers, d, vocab, seq_len, f.boolean("tie_word_embeddings", false), "embed.embedding.weight");
}

// GPT-2: embed (token and position), h_0..n-1 (gpt2_block), ln_f, lm_head.
void gpt2(const Fields& f, int64_t seq_len, HfSpec& spec) {
  const int64_t big = int64_t{1} << 30;
  const int64_t vocab = f.integer("vocab_size", 0, 1, big, true), d = f.integer("n_embd", 0, 1, big, true);
  const int64_t n = f.integer("n_layer", 0, 1, 4096, true), heads = f.integer("n_head", 0, 1, 1 << 16, true);
  const int64_t positions = f.integer("n_positions", 1024, 1, big), ff = f.integer("n_inner", 4 * d, 1, big);
  if (d % heads) f.fail("n_head", detail::concat("must divide n_embd (", d, ")"));
  if (seq_len > positions) f.fail("n_positions", detail::concat("is ", positions, ", fewer than model.seq_len (", seq_len, ")"));
  const std::string act = f.string("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") f.fail("activation_function", "'" + act + "' is not supported (gelu_new)");
  f.require("scale_attn_weights", true, "attention scaled by 1/sqrt(head_dim)");
  f.require("scale_attn_by_inverse_layer_idx", false, "attention scaled by 1/sqrt(head_dim) alone");
  f.require("add_cross_attention", false, "a decoder without cross-attention");
  auto pdrop = [&](const std::string& k) {
    const double p = f.number(k, 0.1);
    if (p < 0 || p > 0.99) f.fail(k, detail::concat("must be in [0, 0.99], got ", p));
    return p;
  };
  const double eps = f.number("layer_norm_epsilon", 1e-5);
  json layers = json::array();
  layers.push_back({{"name", "embed"}, {"type", "embedding"}, {"num_embeddings", vocab}, {"embedding_dim", d},
                    {"max_positions", positions}, {"dropout", pdrop("embd_pdrop")}});
  spec.tensors.push_back({"embed.embedding.tok.weight", "transformer.wte.weight"});
  spec.tensors.push_back({"embed.embedding.pos.weight", "transformer.wpe.weight"});
  json block{{"type", "gpt2_block"}, {"d_model", d}, {"n_heads", heads}, {"d_ff", ff}, {"eps", eps},
             {"dropout", pdrop("resid_pdrop")}, {"attn_dropout", pdrop("attn_pdrop")}};
  for (int64_t i = 0; i < n; ++i) {
    block["name"] = detail::concat("h_", i);
    layers.push_back(block);
    const std::string ours = detail::concat("h_", i, ".gpt2."), theirs = detail::concat("transformer.h.", i, ".");
    for (const char* s : {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias", "attn.c_attn.bias", "attn.c_proj.bias",
                          "mlp.c_fc.bias", "mlp.c_proj.bias"})
      spec.tensors.push_back({ours + s, theirs + s});
    for (const char* s : {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"})
      spec.tensors.push_back({ours + s, theirs + s, /*transposed=*/true});
  }
  layers.push_back({{"name", "ln_f"}, {"type", "layernorm"}, {"normalized_shape", d}, {"eps", eps}});
  spec.tensors.push_back({"ln_f.ln.weight", "transformer.ln_f.weight"});
  spec.tensors.push_back({"ln_f.ln.bias", "transformer.ln_f.bias"});
  with_head(spec, layers, d, vocab, seq_len, f.boolean("tie_word_embeddings", true), "embed.embedding.tok.weight");
}

// Tensors a checkpoint may hold beyond the parameters: buffers older versions saved.
bool ignorable(const std::string& name) {
  auto ends = [&](const std::string& s) { return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0; };
  return ends(".attn.bias") || ends(".attn.masked_bias") || ends(".rotary_emb.inv_freq");
}

bool is_dir(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

const std::vector<std::string>& hf_architectures() {
  static const std::vector<std::string> a{kLlama, kMistral, kQwen2, kQwen3, kPhi3, kGpt2};
  return a;
}

HfSpec read_hf_spec(const std::string& dir, int64_t seq_len, const std::string& where) {
  if (!is_dir(dir)) throw ConfigError(where + ": " + dir + " is not a directory (one written by save_pretrained)");
  const std::string file = dir + "/config.json";
  HfSpec spec;
  try {
    spec.config = parse_unique_json(read_text(file, where), file);
  } catch (const SafetensorsError& e) {
    throw ConfigError(where + ": " + e.what());
  }
  if (!spec.config.is_object()) throw ConfigError(where + ": " + file + " is not a JSON object");
  const Fields f(spec.config, where + ": " + file);
  spec.architecture = architecture_of(spec.config, f);
  if (spec.architecture == kGpt2) gpt2(f, seq_len, spec);
  else llama_family(spec.architecture, f, seq_len, spec);
  return spec;
}

Model build_hf(JsonReader& r) {
  const std::string dir = r.get_string("path", "");
  if (dir.empty()) r.fail("path", "is required: a directory written by transformers' save_pretrained");
  const int64_t seq_len = r.require_int("seq_len", 1, int64_t{1} << 24);
  const std::string where = r.where("path");
  const HfSpec spec = read_hf_spec(dir, seq_len, where);
  JsonReader list(spec.layers, r.path(), dir + "/config.json");
  Model m = build_layer_list(list);

  SafetensorsCheckpoint ck(dir);
  bool wide = false;  // a float64 checkpoint builds a float64 model
  for (const HfTensor& t : spec.tensors)
    if (ck.contains(t.theirs) && ck.get(t.theirs).scalar_type() == at::kDouble) wide = true;
  if (wide) m.layers->to(torch::kDouble);
  auto params = m.layers->named_parameters();
  std::set<std::string> used;
  std::map<std::string, int64_t> fused_rows;  // a fused tensor's rows, all its parts'
  for (const HfTensor& t : spec.tensors) fused_rows[t.theirs] += t.rows;
  torch::NoGradGuard no_grad;
  for (const HfTensor& t : spec.tensors) {
    at::Tensor p = params[t.ours];
    if (!ck.contains(t.theirs)) {
      if (spec.tied && t.ours == "lm_head.linear.weight") continue;  // the embedding, copied below
      throw ConfigError(detail::concat(where, ": ", dir, " has no tensor '", t.theirs, "' (", spec.architecture, " as config.json describes it needs one)"));
    }
    at::Tensor w = ck.get(t.theirs);
    used.insert(t.theirs);
    if (!w.is_floating_point())
      throw ConfigError(detail::concat(where, ": ", ck.file_of(t.theirs), ": tensor '", t.theirs, "' is ", w.scalar_type(), ", not floating point"));
    if (t.transposed && w.dim() == 2) w = w.t();
    if (t.rows > 0) {
      const int64_t whole = fused_rows.at(t.theirs);
      if (w.dim() != 2 || w.size(0) != whole || w.size(1) != p.size(1))
        throw ConfigError(detail::concat(where, ": ", ck.file_of(t.theirs), ": tensor '", t.theirs, "' has shape ", w.sizes(),
                                         ", config.json makes it [", whole, ", ", p.size(1), "]"));
      w = w.narrow(0, t.row_offset, t.rows);
    }
    if (w.sizes() != p.sizes())
      throw ConfigError(detail::concat(where, ": ", ck.file_of(t.theirs), ": tensor '", t.theirs, "' has shape ", w.sizes(),
                                       ", config.json makes it ", t.transposed ? p.t().sizes() : p.sizes()));
    p.copy_(w);
  }
  if (spec.tied) {
    const std::string embed = spec.architecture == kGpt2 ? "embed.embedding.tok.weight" : "embed.embedding.weight";
    params["lm_head.linear.weight"].copy_(params[embed]);
    used.insert("lm_head.weight");
  }
  for (const std::string& name : ck.names())
    if (!used.count(name) && !ignorable(name))
      throw ConfigError(detail::concat(where, ": ", ck.file_of(name), ": tensor '", name, "' is not part of a ", spec.architecture,
                                       " as config.json describes it (an unsupported option would compute a different model)"));
  return m;
}

size_t save_hf(const std::string& source, const std::map<std::string, at::Tensor>& weights, const std::string& out,
               uint64_t shard_bytes) {
  const HfSpec spec = read_hf_spec(source, 1, "export --format hf");
  NamedTensors tensors;
  std::map<std::string, std::vector<at::Tensor>> parts;  // a fused tensor's parts, in row order
  at::ScalarType type = at::kFloat;
  for (const HfTensor& t : spec.tensors) {
    if (spec.tied && t.ours == "lm_head.linear.weight") continue;  // save_pretrained leaves the tied head out
    const auto it = weights.find(t.ours);
    if (it == weights.end())
      throw ConfigError(detail::concat("export --format hf: the weights have no '", t.ours, "', which ", spec.architecture, " of ",
                                       source, " needs (was the model built from it?)"));
    at::Tensor w = it->second.detach().cpu();
    if (t.transposed) w = w.t();
    type = w.scalar_type();
    if (t.rows == 0) {
      tensors.emplace_back(t.theirs, w.contiguous());
    } else if (parts[t.theirs].empty()) {  // its place among the tensors; filled in below
      tensors.emplace_back(t.theirs, at::Tensor());
    }
    if (t.rows > 0) parts[t.theirs].push_back(w);
  }
  for (auto& [name, w] : tensors)
    if (!w.defined()) w = torch::cat(parts.at(name), 0).contiguous();
  if (weights.size() != spec.tensors.size())
    for (const auto& entry : weights) {
      const std::string& name = entry.first;
      const bool known = std::any_of(spec.tensors.begin(), spec.tensors.end(), [&](const HfTensor& t) { return t.ours == name; });
      if (!known)
        throw ConfigError(detail::concat("export --format hf: the weights hold '", name, "', which is not part of ", spec.architecture,
                                         " of ", source));
    }
  ::mkdir(out.c_str(), 0777);
  if (!is_dir(out)) throw ConfigError("export --format hf: cannot make the directory " + out);
  save_safetensors_checkpoint(out, tensors, shard_bytes, {{"format", "pt"}});
  json config = spec.config;
  const std::string dtype = type == at::kDouble ? "float64" : type == at::kBFloat16 ? "bfloat16" : type == at::kHalf ? "float16" : "float32";
  if (config.contains("dtype") || !config.contains("torch_dtype")) config["dtype"] = dtype;
  if (config.contains("torch_dtype")) config["torch_dtype"] = dtype;
  const std::string text = config.dump(2) + "\n";
  write_file_atomically(out + "/config.json", text.data(), text.size());
  for (const char* name : {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "vocab.json", "merges.txt", "tokenizer.model"}) {
    std::ifstream in(source + "/" + name, std::ios::binary);
    if (!in) continue;
    std::ostringstream s;
    s << in.rdbuf();
    const std::string bytes = s.str();
    write_file_atomically(out + "/" + name, bytes.data(), bytes.size());
  }
  return tensors.size();
}

}  // namespace pipetrain::models
