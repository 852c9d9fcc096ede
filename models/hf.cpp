#include "models/hf.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/strings.h"
#include "models/families.h"
#include "models/hf_fields.h"
#include "models/hf_lora.h"

namespace pipetrain::models {

namespace {

using json = nlohmann::json;
using namespace hf_detail;

std::string read_text(const std::string& path, const std::string& where) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(where + ": cannot read " + path + " (a directory written by save_pretrained has it)");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string architecture_of(const json& config, const Fields& f) {
  if (f.has("architectures")) {
    const json& a = f.at("architectures");
    if (!a.is_array() || a.size() != 1 || !a[0].is_string()) f.fail("architectures", "must list one architecture, got " + a.dump());
    const std::string name = a[0].get<std::string>();
    if (std::find(hf_architectures().begin(), hf_architectures().end(), name) == hf_architectures().end())
      f.fail("architectures", "'" + name + "' is not supported (" + join(hf_architectures(), ", ") + ")");
    return name;
  }
  static const std::map<std::string, std::string> by_type{{"llama", kLlama}, {"mistral", kMistral}, {"ministral3", kMinistral3}, {"qwen2", kQwen2}, {"qwen3", kQwen3},
                                                                {"phi3", kPhi3}, {"olmo2", kOlmo2}, {"olmo3", kOlmo3}, {"gemma", kGemma}, {"gemma2", kGemma2},
                                                                {"gemma3_text", kGemma3}, {"granite", kGranite}, {"granitemoe", kGraniteMoe}, {"granitemoeshared", kGraniteMoeShared}, {"granitemoehybrid", kGraniteMoeHybrid}, {"smollm3", kSmolLM3}, {"mixtral", kMixtral}, {"qwen2_moe", kQwen2Moe}, {"qwen3_moe", kQwen3Moe}, {"olmoe", kOlmoe}, {"deepseek_v2", kDeepseekV2}, {"deepseek_v3", kDeepseekV3}, {"glm4_moe", kGlm4Moe}, {"gpt_oss", kGptOss}, {"llama4_text", kLlama4}, {"llama4", kLlama4Vision}, {"glm4", kGlm4}, {"ernie4_5", kErnie45}, {"exaone4", kExaone4}, {"minimax_m2", kMiniMaxM2}, {"arcee", kArcee}, {"apertus", kApertus}, {"hunyuan_v1_dense", kHunyuan}, {"qwen3_next", kQwen3Next}, {"qwen3_5_text", kQwen35}, {"qwen3_5_moe_text", kQwen35Moe}, {"qwen3_5", kQwen35Vision}, {"qwen3_5_moe", kQwen35MoeVision}, {"gemma3", kGemma3Vision}, {"mistral3", kMistral3}, {"qwen3_vl", kQwen3VL}, {"llava", kLlava}, {"internvl", kInternVL}, {"aya_vision", kAyaVision}, {"qwen3_vl_moe", kQwen3VLMoe}, {"qwen2_vl", kQwen2VL}, {"qwen2_5_vl", kQwen25VL},
                                                                {"nemotron_h", kNemotronH}, {"bamba", kBamba}, {"cohere", kCohere}, {"cohere2", kCohere2}, {"starcoder2", kStarcoder2}, {"seed_oss", kSeedOss}, {"gpt2", kGpt2},
                                                                {"gpt_neox", kGptNeoX}, {"phi", kPhi}, {"stablelm", kStableLm}, {"falcon", kFalcon}, {"gptj", kGptJ}, {"gpt_bigcode", kGptBigCode}, {"olmo", kOlmo}};
  const std::string type = f.string("model_type", "");
  const auto it = by_type.find(type);
  if (it == by_type.end()) {
    std::vector<std::string> types;
    for (const auto& entry : by_type) types.push_back(entry.first);
    f.fail("model_type", "'" + type + "' is not supported (" + join(types, ", ") + "), and no architectures are named");
  }
  (void)config;
  return it->second;
}

}  // namespace

double hf_detail::dropout_probability(const Fields& f, const std::string& key, double def) {
  const double p = f.number(key, def);
  if (p < 0 || p > 0.99) f.fail(key, detail::concat("must be in [0, 0.99], got ", p));
  return p;
}

Gpt2Sizes hf_detail::gpt2_sizes(const Fields& f, int64_t seq_len) {
  const int64_t big = int64_t{1} << 30;
  Gpt2Sizes s;
  s.vocab = f.integer("vocab_size", 0, 1, big, true);
  s.d = f.integer("n_embd", 0, 1, big, true);
  s.n = f.integer("n_layer", 0, 1, 4096, true);
  s.heads = f.integer("n_head", 0, 1, 1 << 16, true);
  s.positions = f.integer("n_positions", 1024, 1, big);
  s.ff = f.integer("n_inner", 4 * s.d, 1, big);
  if (s.d % s.heads) f.fail("n_head", detail::concat("must divide n_embd (", s.d, ")"));
  if (seq_len > s.positions) f.fail("n_positions", detail::concat("is ", s.positions, ", fewer than model.seq_len (", seq_len, ")"));
  return s;
}

json hf_detail::gpt2_embedding(const Fields& f, int64_t vocab, int64_t d, int64_t positions, HfSpec& spec) {
  spec.tensors.push_back({"embed.embedding.tok.weight", "transformer.wte.weight"});
  spec.tensors.push_back({"embed.embedding.pos.weight", "transformer.wpe.weight"});
  return {{"name", "embed"}, {"type", "embedding"}, {"num_embeddings", vocab}, {"embedding_dim", d},
          {"max_positions", positions}, {"dropout", dropout_probability(f, "embd_pdrop", 0.1)}};
}

namespace {

// GPT-2: embed (token and position), h_0..n-1 (gpt2_block), ln_f, lm_head.
void gpt2(const Fields& f, int64_t seq_len, HfSpec& spec) {
  const auto [vocab, d, n, heads, positions, ff] = gpt2_sizes(f, seq_len);
  const std::string act = f.string("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") f.fail("activation_function", "'" + act + "' is not supported (gelu_new)");
  f.require("scale_attn_weights", true, "attention scaled by 1/sqrt(head_dim)");
  f.require("scale_attn_by_inverse_layer_idx", false, "attention scaled by 1/sqrt(head_dim) alone");
  f.require("add_cross_attention", false, "a decoder without cross-attention");
  auto pdrop = [&](const std::string& k) { return dropout_probability(f, k, 0.1); };
  const double eps = f.number("layer_norm_epsilon", 1e-5);
  json layers = json::array({gpt2_embedding(f, vocab, d, positions, spec)});
  json block{{"type", "gpt2_block"}, {"d_model", d}, {"n_heads", heads}, {"d_ff", ff}, {"eps", eps},
             {"dropout", pdrop("resid_pdrop")}, {"attn_dropout", pdrop("attn_pdrop")}};
  if (act == "gelu_new") block["act"] = "gelu_new";  // op by op, as transformers computes it
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
  // GPT-2's and GPT-NeoX's causal masks, saved as buffers by older versions; the rotary tables.
  return ends(".attn.bias") || ends(".attn.masked_bias") || ends(".attention.bias") || ends(".attention.masked_bias") ||
         ends(".rotary_emb.inv_freq");
}

// w [rows, ...] as [rows / n, n, ...]: groups of n rows.
at::Tensor in_groups(const at::Tensor& w, int64_t n) {
  std::vector<int64_t> shape{w.size(0) / n, n};
  for (int64_t d = 1; d < w.dim(); ++d) shape.push_back(w.size(d));
  return w.reshape(shape);
}

bool is_dir(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0;
}

// Whether `name` is one of the tensors spec.ignored names (not part of the model).
bool ignored(const HfSpec& spec, const std::string& name) {
  return std::any_of(spec.ignored.begin(), spec.ignored.end(), [&](const std::string& p) { return name.rfind(p, 0) == 0; });
}

// `dir`'s checkpoint where it has one that opens (reading the weights says what is wrong with
// one that does not), else null: what a config's reading may look at (tensors' shapes).
std::unique_ptr<SafetensorsCheckpoint> checkpoint_if_any(const std::string& dir) {
  try {
    if (exists(dir + "/" + kSafetensorsSingle) || exists(dir + "/" + kSafetensorsIndex)) return std::make_unique<SafetensorsCheckpoint>(dir);
  } catch (const SafetensorsError&) {
  }
  return nullptr;
}

// transformers 5.24 ties the head to the embedding as the config says, unless the checkpoint holds
// both with different values: then it leaves them untied (a config that does not describe its
// checkpoint, as some published vision models' are). So does this, from the checkpoint.
void untie_where_both_differ(const SafetensorsCheckpoint* ck, HfSpec& spec) {
  if (!spec.tied || !ck) return;
  std::string head, embed;
  for (const HfTensor& t : spec.tensors) {
    if (t.ours == "lm_head.linear.weight") head = t.theirs;
    if (t.ours == "embed.embedding.weight" || t.ours == "embed.embedding.tok.weight") embed = t.theirs;
  }
  if (head.empty() || embed.empty() || !ck->contains(head) || !ck->contains(embed)) return;
  const at::Tensor h = ck->get(head), e = ck->get(embed);
  if (h.sizes() == e.sizes() && h.scalar_type() == e.scalar_type() && torch::equal(h, e)) return;
  spec.tied = false;
  spec.layers.erase("ties");
}

// Qwen3-VL-MoE's experts as its checkpoints hold them, each layer's stacked, in place of
// Qwen3-MoE's expert by expert: as published, transposed, mlp.experts.gate_up_proj [experts,
// hidden, 2 * width] (gate's columns, then up's) and mlp.experts.down_proj [experts, width, hidden];
// or as the module holds them ([experts, 2 * width, hidden], [experts, hidden, width]), as
// transformers 5.24's save_pretrained writes them. transformers reads either, transposing a tensor
// whose shape is not the module's; so does this, from the checkpoint `ck` (as published without one:
// a spec read before its weights are written).
void stack_experts(const SafetensorsCheckpoint* ck, int64_t width, int64_t hidden, HfSpec& spec) {
  const auto as_module = [&](const std::string& name, std::vector<int64_t> module) {
    return ck && ck->contains(name) && ck->get(name).sizes().slice(1) == c10::IntArrayRef(module);
  };
  for (HfTensor& t : spec.tensors) {
    const size_t at = t.theirs.find(".mlp.experts.");
    if (at == std::string::npos) continue;
    const std::string layer = t.theirs.substr(0, at + 13), rest = t.theirs.substr(at + 13);  // "<e>.gate_proj.weight"
    const size_t dot = rest.find('.');
    const int64_t e = std::stoll(rest.substr(0, dot));
    const std::string part = rest.substr(dot + 1);
    if (part == "down_proj.weight") t = {t.ours, layer + "down_proj", !as_module(layer + "down_proj", {hidden, width}), 0, 0, e};
    else t = {t.ours, layer + "gate_up_proj", !as_module(layer + "gate_up_proj", {2 * width, hidden}), part == "gate_proj.weight" ? 0 : width, width, e};
  }
}

// A vision model's text_config as transformers completes it: where a field our reading needs is
// absent, its config class's default (transformers 5.24's), which published configs rely on (Gemma
// 3's and LLaVA 1.5's text_config name a few sizes alone).
void complete_text(json& text, const std::string& type) {
  using D = std::vector<std::pair<const char*, json>>;
  auto sizes = [](int64_t vocab, int64_t d, int64_t ff, int64_t n, int64_t heads, int64_t kv) {
    return D{{"vocab_size", vocab}, {"hidden_size", d}, {"intermediate_size", ff}, {"num_hidden_layers", n},
             {"num_attention_heads", heads}, {"num_key_value_heads", kv}};
  };
  static const std::map<std::string, D> kDefaults{
      {"gemma3_text", sizes(262208, 2304, 9216, 26, 8, 4)}, {"llama", sizes(32000, 4096, 11008, 32, 32, 32)},
      {"mistral", sizes(32000, 4096, 14336, 32, 32, 8)},    {"ministral3", sizes(131072, 4096, 14336, 34, 32, 8)},
      {"qwen2", sizes(151936, 4096, 22016, 32, 32, 32)},    {"qwen3", sizes(151936, 4096, 22016, 32, 32, 32)},
      {"cohere2", sizes(256000, 8192, 22528, 40, 64, 64)},  {"qwen3_vl_text", sizes(151936, 4096, 22016, 32, 32, 32)},
      {"qwen3_vl_moe_text", sizes(151936, 2048, 5632, 24, 16, 16)}, {"qwen2_vl_text", sizes(152064, 8192, 29568, 80, 64, 8)},
      {"qwen2_5_vl_text", sizes(152064, 8192, 29568, 80, 64, 8)}};
  static const std::map<std::string, D> kMore{
      {"gemma3_text", {{"head_dim", 256}, {"query_pre_attn_scalar", 256}, {"sliding_window", 4096}, {"max_position_embeddings", 131072}}},
      {"qwen3_vl_text", {{"head_dim", 128}, {"rope_theta", 5e5}}},
      {"qwen3_vl_moe_text", {{"rope_theta", 5e5}, {"num_experts", 60}, {"num_experts_per_tok", 4}, {"moe_intermediate_size", 1408}}}};
  for (const auto* table : {&kDefaults, &kMore}) {
    const auto it = table->find(type);
    if (it == table->end()) continue;
    for (const auto& [key, value] : it->second) {
      const bool theta_given = std::string(key) == "rope_theta" && text.contains("rope_parameters") && text["rope_parameters"].is_object() &&
                               text["rope_parameters"].contains("rope_theta");
      if (!text.contains(key) && !theta_given) text[key] = value;
    }
  }
}

// Qwen2-VL's and Qwen2.5-VL's language model's config as transformers 5.24 reads it: text_config,
// or (as published) the outer config's own fields; their defaults where Qwen2's differ (eps 1e-5,
// rope_theta 1e6, windows from layer 80); the "mrope" rope the default one (its sections of the
// three position grids are one rotation on text alone); tied where either config says so.
json qwen2_vl_text(const Fields& f, const json& config) {
  json text = config;
  if (f.has("text_config")) {
    if (!f.at("text_config").is_object()) f.fail("text_config", "must be an object (the language model's config)");
    text = config.at("text_config");
  }
  text.erase("vision_config");
  complete_text(text, "qwen2_5_vl_text");  // Qwen2-VL's the same
  if (!text.contains("rms_norm_eps")) text["rms_norm_eps"] = 1e-5;
  if (!text.contains("max_window_layers")) text["max_window_layers"] = 80;
  // transformers takes rope_scaling where it is given, rope_parameters otherwise.
  const bool scaling = text.contains("rope_scaling") && text["rope_scaling"].is_object() && !text["rope_scaling"].empty();
  const std::string key = scaling ? "rope_scaling" : "rope_parameters";
  json rope = text.contains(key) && text[key].is_object() ? text[key] : json::object();
  if (rope.value("rope_type", rope.value("type", std::string("default"))) == "mrope") {
    rope.erase("type");
    rope["rope_type"] = "default";
  }
  if (!rope.contains("rope_theta") && !text.contains("rope_theta")) rope["rope_theta"] = 1e6;
  text.erase("rope_scaling");
  text["rope_parameters"] = rope;  // the one read
  const bool tied = f.boolean("tie_word_embeddings", false) || (text.contains("tie_word_embeddings") && text["tie_word_embeddings"] == true);
  text["tie_word_embeddings"] = tied;
  return text;
}

// A vision model's language model in llava's layout, as published and as save_pretrained writes
// it: Gemma 3 (4B and up), Mistral 3 (Mistral Small 3.1 and 3.2, Ministral 3), LLaVA (1.5, Pixtral
// and the like), InternVL (3, 3.5) and Aya Vision. The text_config's language model (of the
// model_types each takes) under language_model. (language_model.model.*, language_model.lm_head.weight),
// tied as the outer config says (its default as transformers 5.24 reads it; LLaVA's also where
// text_config says so); the vision tower and the projector beside it are not read (and are written
// back unchanged by save_hf). Text alone takes the language model's path in transformers with the
// wrapper's own head: Gemma 3's is never soft-capped there, Aya Vision's Cohere 2 logits never scaled.
struct BesideVision {
  std::string arch;
  std::vector<std::pair<std::string, std::string>> texts;  // model_type → the causal model; the first the default
  bool tied;                                               // tie_word_embeddings's default
};

void language_model_beside_vision(const Fields& f, const json& config, const std::string& where, int64_t seq_len, HfSpec& spec) {
  static const std::vector<BesideVision> kinds{
      {kGemma3Vision, {{"gemma3_text", kGemma3}}, true},
      {kMistral3, {{"mistral", kMistral}, {"ministral3", kMinistral3}}, true},
      {kLlava, {{"llama", kLlama}, {"mistral", kMistral}, {"qwen2", kQwen2}}, false},
      {kInternVL, {{"qwen2", kQwen2}, {"qwen3", kQwen3}, {"llama", kLlama}}, true},
      {kAyaVision, {{"cohere2", kCohere2}}, true}};
  const BesideVision& kind = *std::find_if(kinds.begin(), kinds.end(), [&](const BesideVision& k) { return k.arch == spec.architecture; });
  if (!f.has("text_config") || !f.at("text_config").is_object()) f.fail("text_config", "must be an object (the language model's config)");
  json text = config.at("text_config");
  const Fields t(text, where + ": text_config");
  const std::string type = t.string("model_type", kind.texts.front().first);
  const auto it = std::find_if(kind.texts.begin(), kind.texts.end(), [&](const auto& p) { return p.first == type; });
  if (it == kind.texts.end()) {
    std::vector<std::string> types;
    for (const auto& p : kind.texts) types.push_back(p.first);
    t.fail("model_type", "'" + type + "' is not supported for " + spec.architecture + " (" + join(types, ", ") + ")");
  }
  complete_text(text, type);
  text["tie_word_embeddings"] = f.boolean("tie_word_embeddings", kind.tied) || (kind.arch == kLlava && t.boolean("tie_word_embeddings", false));
  if (kind.arch == kGemma3Vision) text.erase("final_logit_softcapping");
  if (kind.arch == kAyaVision) text["logit_scale"] = 1.0;
  llama_family(it->second, Fields(text, where + ": text_config"), seq_len, spec);
  for (HfTensor& tensor : spec.tensors) tensor.theirs = "language_model." + tensor.theirs;
  spec.ignored = {"vision_tower.", "multi_modal_projector."};
}

}  // namespace

const std::vector<std::string>& hf_architectures() {
  static const std::vector<std::string> a{kLlama,  kMistral, kMinistral3, kQwen2,   kQwen3,  kPhi3,     kOlmo2, kOlmo3,
                                          kGemma,  kGemma2,  kGemma3,  kGranite, kGraniteMoe, kGraniteMoeShared, kGraniteMoeHybrid, kSmolLM3, kMixtral, kQwen2Moe, kQwen3Moe, kOlmoe, kDeepseekV2, kDeepseekV3, kGlm4Moe, kGptOss, kLlama4, kLlama4Vision, kGlm4, kErnie45, kExaone4, kMiniMaxM2, kArcee, kApertus, kHunyuan, kQwen3Next, kQwen35, kQwen35Moe, kQwen35Vision, kQwen35MoeVision, kGemma3Vision, kMistral3, kLlava, kInternVL, kAyaVision, kQwen3VL, kQwen3VLMoe, kQwen2VL, kQwen25VL, kNemotronH, kBamba, kCohere, kCohere2, kStarcoder2, kSeedOss, kGpt2, kGptNeoX, kPhi, kStableLm, kFalcon, kGptJ, kGptBigCode, kOlmo};
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
  // The checkpoint's headers, opened once where a reading needs them (Qwen3-VL-MoE's experts, a tie).
  std::unique_ptr<SafetensorsCheckpoint> checkpoint;
  bool opened = false;
  auto headers = [&] {
    if (!opened) checkpoint = checkpoint_if_any(dir);
    opened = true;
    return checkpoint.get();
  };
  if (f.has("quantization_config")) spec.quantization = read_hf_quantization(f.at("quantization_config"), where + ": " + file);
  // The families read by a file of their own, from config.json as it is.
  using Reader = void (*)(const Fields&, const json&, int64_t, HfSpec&);
  static const std::map<std::string, Reader> readers{{kStarcoder2, starcoder2}, {kSeedOss, seed_oss}, {kGptNeoX, gpt_neox}, {kPhi, phi},
                                                     {kStableLm, stablelm},     {kFalcon, falcon},    {kGptJ, gptj},         {kGptBigCode, gpt_bigcode},
                                                     {kOlmo, olmo}};
  if (spec.architecture == kGpt2) {
    gpt2(f, seq_len, spec);
  } else if (const auto reader = readers.find(spec.architecture); reader != readers.end()) {
    reader->second(f, spec.config, seq_len, spec);
  } else if (spec.architecture == kNemotronH) {
    nemotron_h(f, seq_len, spec);
  } else if (spec.architecture == kLlama4Vision) {
    // Its language model, Llama4ForCausalLM under language_model.; its vision model and projector
    // are not read (and are written back unchanged by save_hf).
    if (!f.has("text_config") || !f.at("text_config").is_object()) f.fail("text_config", "must be an object (the language model's config)");
    if (f.boolean("tie_word_embeddings", false)) f.fail("tie_word_embeddings", "true is not supported here (text_config's is read)");
    llama_family(kLlama4, Fields(spec.config.at("text_config"), where + ": " + file + ": text_config"), seq_len, spec);
    for (HfTensor& t : spec.tensors) t.theirs = "language_model." + t.theirs;
    spec.ignored = {"vision_model.", "multi_modal_projector."};
  } else if (spec.architecture == kQwen35Vision || spec.architecture == kQwen35MoeVision || spec.architecture == kQwen3VL ||
             spec.architecture == kQwen3VLMoe) {
    // Qwen3.5 and Qwen3-VL as published: the language model under model.language_model., the head
    // beside it, tied as the outer config says (untied by default); the vision model is not read
    // (and is written back unchanged by save_hf). Qwen3-VL's is Qwen3's (Qwen3-MoE's): on text
    // alone its three position grids are the one sequence, its sections of the rotation Qwen3's.
    if (!f.has("text_config") || !f.at("text_config").is_object()) f.fail("text_config", "must be an object (the language model's config)");
    json text = spec.config.at("text_config");
    text["tie_word_embeddings"] = f.boolean("tie_word_embeddings", false);
    const std::string& a = spec.architecture;
    if (a == kQwen3VL || a == kQwen3VLMoe) complete_text(text, a == kQwen3VL ? "qwen3_vl_text" : "qwen3_vl_moe_text");
    const Fields t(text, where + ": " + file + ": text_config");
    if (a == kQwen3VLMoe) {  // Qwen3-MoE's routing, always renormalized; its heads' size hidden_size / heads by default
      text["norm_topk_prob"] = true;
      if (!t.has("head_dim")) text["head_dim"] = t.integer("hidden_size", 0, 1, int64_t{1} << 30, true) / t.integer("num_attention_heads", 0, 1, 1 << 20, true);
    }
    llama_family(a == kQwen35Vision ? kQwen35 : a == kQwen35MoeVision ? kQwen35Moe : a == kQwen3VL ? kQwen3 : kQwen3Moe, t, seq_len, spec);
    for (HfTensor& tensor : spec.tensors)
      if (tensor.theirs.rfind("model.", 0) == 0) tensor.theirs = "model.language_model." + tensor.theirs.substr(6);
    if (a == kQwen3VLMoe) stack_experts(headers(), t.integer("moe_intermediate_size", 1408, 1, int64_t{1} << 30), t.integer("hidden_size", 0, 1, int64_t{1} << 30, true), spec);
    spec.ignored = {"model.visual."};
  } else if (spec.architecture == kQwen2VL || spec.architecture == kQwen25VL) {
    // Qwen2-VL and Qwen2.5-VL as published: Qwen2's names (model.layers.*, lm_head), the vision
    // model beside them under visual. (not read; written back unchanged by save_hf).
    llama_family(kQwen2, Fields(qwen2_vl_text(f, spec.config), where + ": " + file), seq_len, spec);
    spec.ignored = {"visual."};
  } else if (spec.architecture == kGemma3Vision || spec.architecture == kMistral3 || spec.architecture == kLlava ||
             spec.architecture == kInternVL || spec.architecture == kAyaVision) {
    language_model_beside_vision(f, spec.config, where + ": " + file, seq_len, spec);
  } else {
    llama_family(spec.architecture, f, seq_len, spec);
  }
  if (spec.tied) untie_where_both_differ(headers(), spec);
  return spec;
}

Model build_hf(JsonReader& r) {
  const std::string dir = r.get_string("path", "");
  if (dir.empty()) r.fail("path", "is required: a directory written by transformers' save_pretrained");
  const int64_t seq_len = r.require_int("seq_len", 1, int64_t{1} << 24);
  const std::string where = r.where("path");
  HfSpec spec = read_hf_spec(dir, seq_len, where);
  // The mixtures of experts' products: expert by expert (transformers' "eager"), or grouped.
  const std::string kernel = r.get_choice("experts_kernel", "loop", {"loop", "grouped"});
  bool moe = false;
  for (nlohmann::json& layer : spec.layers["layers"])
    if (layer.contains("experts")) {
      layer["experts_kernel"] = kernel;
      moe = true;
    }
  if (!moe && r.has("experts_kernel")) r.fail("experts_kernel", detail::concat("needs a mixture of experts (", spec.architecture, " has none)"));
  HfLora lora = read_hf_lora(r);  // adapters beside the blocks' projections, all else frozen (hf_lora.h)
  add_hf_lora(lora, spec);
  JsonReader list(spec.layers, r.path(), dir + "/config.json");
  Model m = build_layer_list(list);

  SafetensorsCheckpoint ck(dir);
  const HfWeights weights(ck, spec.quantization, where);  // dequantized where quantized
  bool wide = false;  // a float64 checkpoint builds a float64 model
  for (const HfTensor& t : spec.tensors)
    if (ck.contains(t.theirs) && ck.get(t.theirs).scalar_type() == at::kDouble) wide = true;
  if (wide) m.layers->to(torch::kDouble);
  std::map<std::string, at::Tensor> params;  // and buffers: DeepSeek-V3's e_score_correction_bias
  for (const auto& p : m.layers->named_parameters()) params[p.key()] = p.value();
  for (const auto& b : m.layers->named_buffers()) params[b.key()] = b.value();
  std::set<std::string> used;
  std::map<std::string, int64_t> fused_rows, slices;  // a fused tensor's rows (one slice's), all its parts'; a stack's slices
  for (const HfTensor& t : spec.tensors) {
    if (t.slice <= 0) fused_rows[t.theirs] += t.rows;
    if (t.slice >= 0) slices[t.theirs] = std::max(slices[t.theirs], t.slice + 1);
  }
  torch::NoGradGuard no_grad;
  for (const HfTensor& t : spec.tensors) {
    at::Tensor p = t.ours_row >= 0 ? params.at(t.ours).select(0, t.ours_row) : params.at(t.ours);
    if (!weights.contains(t.theirs)) {
      if (spec.tied && t.ours == "lm_head.linear.weight") continue;  // the embedding, copied below
      throw ConfigError(detail::concat(where, ": ", dir, " has no tensor '", t.theirs, "' (", spec.architecture, " as config.json describes it needs one)"));
    }
    std::vector<std::string> from;
    at::Tensor w = weights.get(t.theirs, &from);
    used.insert(from.begin(), from.end());
    if (!w.is_floating_point())
      throw ConfigError(detail::concat(where, ": ", weights.file_of(t.theirs), ": tensor '", t.theirs, "' is ", w.scalar_type(), ", not floating point"));
    if (t.slice >= 0) {
      const int64_t n = slices.at(t.theirs);
      if (w.dim() != p.dim() + 1 || w.size(0) != n)
        throw ConfigError(detail::concat(where, ": ", weights.file_of(t.theirs), ": tensor '", t.theirs, "' has shape ", w.sizes(),
                                         ", config.json makes it a stack of ", n, " tensors of ", p.dim(), " dimensions"));
      w = w.select(0, t.slice);
    }
    if (t.transposed && w.dim() == 2) w = w.t();
    if (t.rows > 0) {
      const int64_t whole = fused_rows.at(t.theirs);
      if (w.dim() != p.dim() || w.size(0) != whole || (p.dim() == 2 && w.size(1) != p.size(1)))
        throw ConfigError(detail::concat(where, ": ", weights.file_of(t.theirs), ": tensor '", t.theirs, "' has shape ", w.sizes(),
                                         ", config.json makes it [", whole, p.dim() == 2 ? detail::concat(", ", p.size(1)) : "", "]"));
      w = t.row_block > 1 ? in_groups(w, t.row_step).narrow(1, t.row_offset, t.row_block).reshape(p.sizes())
                          : w.slice(0, t.row_offset, t.row_offset + (t.rows - 1) * t.row_step + 1, t.row_step);
    }
    if (w.sizes() != p.sizes())
      throw ConfigError(detail::concat(where, ": ", weights.file_of(t.theirs), ": tensor '", t.theirs, "' has shape ", w.sizes(),
                                       ", config.json makes it ", t.transposed ? p.t().sizes() : p.sizes()));
    p.copy_(w);
  }
  if (spec.tied) {
    // The embedding the head is tied to (GPT-2's and GPT-BigCode's beside their positions).
    const std::string embed = params.count("embed.embedding.tok.weight") ? "embed.embedding.tok.weight" : "embed.embedding.weight";
    params["lm_head.linear.weight"].copy_(params[embed]);
    used.insert("lm_head.weight");
  }
  for (const std::string& name : ck.names())
    if (!used.count(name) && !ignorable(name) && !ignored(spec, name) && !weights.inert(name))
      throw ConfigError(detail::concat(where, ": ", ck.file_of(name), ": tensor '", name, "' is not part of a ", spec.architecture,
                                       " as config.json describes it (an unsupported option would compute a different model)"));
  if (lora.lora.rank == 0) return m;
  load_hf_adapter(lora, spec, *m.layers);
  freeze_all_but_adapters(*m.layers);
  return m;
}

size_t save_hf(const std::string& source, const std::map<std::string, at::Tensor>& weights, const std::string& out,
               uint64_t shard_bytes) {
  const HfSpec spec = read_hf_spec(source, 1, "export --format hf");
  NamedTensors tensors;
  // A fused or stacked tensor's parts: by slice (one where it is no stack), each in row order.
  std::map<std::string, std::vector<std::vector<at::Tensor>>> parts;
  std::map<std::string, const HfTensor*> part_of;  // one of a fused tensor's parts: its step and transposition
  std::set<std::string> stacked;
  std::optional<at::ScalarType> widest;  // of the floating tensors; float32 where there is none
  for (const HfTensor& t : spec.tensors) {
    if (spec.tied && t.ours == "lm_head.linear.weight") continue;  // save_pretrained leaves the tied head out
    const auto it = weights.find(t.ours);
    if (it == weights.end())
      throw ConfigError(detail::concat("export --format hf: the weights have no '", t.ours, "', which ", spec.architecture, " of ",
                                       source, " needs (was the model built from it?)"));
    at::Tensor w = it->second.detach().cpu();
    if (t.ours_row >= 0) w = w.select(0, t.ours_row);
    // The config's dtype: the widest type among the tensors (float32 norms beside weights kept
    // in bfloat16, model.frozen_dtype's, load as float32).
    if (at::isFloatingType(w.scalar_type())) widest = widest ? at::promote_types(*widest, w.scalar_type()) : w.scalar_type();
    if (t.rows == 0 && t.slice < 0) {
      tensors.emplace_back(t.theirs, (t.transposed ? w.t() : w).contiguous());
      continue;
    }
    part_of[t.theirs] = &t;
    auto& by_slice = parts[t.theirs];
    if (by_slice.empty()) tensors.emplace_back(t.theirs, at::Tensor());  // its place among the tensors; filled in below
    const size_t s = static_cast<size_t>(std::max<int64_t>(t.slice, 0));
    if (by_slice.size() <= s) by_slice.resize(s + 1);
    by_slice[s].push_back(w);
    if (t.slice >= 0) stacked.insert(t.theirs);
  }
  for (auto& [name, w] : tensors) {
    if (w.defined()) continue;
    // A slice's rows in order (every row_step-th interleaved), then transposed back.
    const HfTensor& t = *part_of.at(name);
    std::vector<at::Tensor> slices;
    for (const auto& rows : parts.at(name)) {
      at::Tensor whole;
      if (t.row_block > 1) {  // each part's blocks side by side again, a group of row_step rows at a time
        int64_t total = 0;
        for (const at::Tensor& r : rows) total += r.size(0);
        const int64_t groups = total / t.row_step;  // each part has a block in every group, of its own size
        std::vector<at::Tensor> blocks;
        for (const at::Tensor& r : rows) blocks.push_back(in_groups(r, r.size(0) / groups));
        whole = torch::cat(blocks, 1).flatten(0, 1);
      } else {
        whole = t.row_step > 1 ? torch::stack(rows, 1).flatten(0, 1) : torch::cat(rows, 0);
      }
      slices.push_back(t.transposed && whole.dim() == 2 ? whole.t() : whole);
    }
    w = (stacked.count(name) ? torch::stack(slices, 0) : slices.front()).contiguous();
  }
  if (weights.size() != spec.tensors.size())
    for (const auto& entry : weights) {
      const std::string& name = entry.first;
      const bool known = std::any_of(spec.tensors.begin(), spec.tensors.end(), [&](const HfTensor& t) { return t.ours == name; });
      if (!known)
        throw ConfigError(detail::concat("export --format hf: the weights hold '", name, "', which is not part of ", spec.architecture,
                                         " of ", source));
    }
  // The source's tensors that are not part of the model (Llama 4's vision model, DeepSeek-V3's
  // prediction layers): written back as the source holds them (views of its mapping until written).
  if (!spec.ignored.empty() && (exists(source + "/" + kSafetensorsSingle) || exists(source + "/" + kSafetensorsIndex))) {
    const SafetensorsCheckpoint ck(source);
    for (const std::string& name : ck.names())
      if (ignored(spec, name)) tensors.emplace_back(name, ck.get(name));
  }
  ::mkdir(out.c_str(), 0777);
  if (!is_dir(out)) throw ConfigError("export --format hf: cannot make the directory " + out);
  save_safetensors_checkpoint(out, tensors, shard_bytes, {{"format", "pt"}});
  json config = spec.config;
  config.erase("quantization_config");  // the weights are written in their own type
  const at::ScalarType type = widest.value_or(at::kFloat);
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
