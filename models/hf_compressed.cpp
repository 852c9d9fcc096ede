// compressed-tensors checkpoints (llm-compressor's format, which vLLM serves), dequantized as they
// are read: models/hf_quantized.h says what is read and how. The formats and their arithmetic are
// compressed-tensors' own (its compressors' decompress and quantization.lifecycle's dequantize);
// tests: tests/hf_quantized_test.cpp (CompressedTensors.*), tests/hf_test.cpp (HfParity.*Compressed*).
#include <regex>
#include <set>

#include <torch/torch.h>

#include "common/error.h"
#include "common/strings.h"
#include "models/hf_quantized.h"

namespace pipetrain::models {

namespace {

using json = nlohmann::json;

const std::set<std::string> kFormats{"pack-quantized", "int-quantized", "float-quantized", "naive-quantized", "nvfp4-pack-quantized"};
const std::set<std::string> kStrategies{"tensor", "channel", "group", "tensor_group", "block"};

// One config group's weights, checked (`at` names the group in errors).
HfCompressedGroup read_group(const std::string& name, const json& g, const std::string& format, const std::string& at,
                             const std::string& where) {
  auto fail = [&](const std::string& key, const std::string& msg) -> void { throw ConfigError(where + ": " + at + key + " " + msg); };
  HfCompressedGroup out;
  out.name = name;
  const json& targets = g.contains("targets") ? g["targets"] : json();
  if (!targets.is_array() || targets.empty()) fail("targets", "must be a list of module names or classes, got " + targets.dump());
  for (const json& t : targets) {
    if (!t.is_string()) fail("targets", "must hold strings, got " + t.dump());
    out.targets.push_back(t.get<std::string>());
  }
  out.format = g.contains("format") && g["format"].is_string() ? g["format"].get<std::string>() : format;
  if (!kFormats.count(out.format))
    fail("format", "'" + out.format +
                       "' is not read (pack-quantized, int-quantized, float-quantized, naive-quantized and nvfp4-pack-quantized are)");
  const json& w = g["weights"];
  const std::string wat = "weights.";
  const auto bits = w.find("num_bits");
  if (bits == w.end() || !bits->is_number_integer() || bits->get<int64_t>() < 1 || bits->get<int64_t>() > 8)
    fail(wat + "num_bits", "must be an integer from 1 to 8, got " + (bits == w.end() ? std::string("nothing") : bits->dump()));
  out.bits = bits->get<int64_t>();
  out.type = w.value("type", std::string("int"));
  if (out.type != "int" && out.type != "float") fail(wat + "type", "must be \"int\" or \"float\", got " + w["type"].dump());
  if (w.contains("symmetric") && !w["symmetric"].is_null()) {
    if (!w["symmetric"].is_boolean()) fail(wat + "symmetric", "must be true or false, got " + w["symmetric"].dump());
    out.symmetric = w["symmetric"].get<bool>();
  }
  if (w.contains("dynamic") && w["dynamic"] != false)
    fail(wat + "dynamic", w["dynamic"].dump() + " is not a stored quantization (the weights' scales are read from the checkpoint)");
  if (w.contains("group_size") && !w["group_size"].is_null()) {
    if (!w["group_size"].is_number_integer() || w["group_size"].get<int64_t>() < 1)
      fail(wat + "group_size", "must be a positive integer, got " + w["group_size"].dump());
    out.group_size = w["group_size"].get<int64_t>();
  }
  if (w.contains("block_structure") && !w["block_structure"].is_null()) {
    const json& b = w["block_structure"];
    if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() || b[0].get<int64_t>() < 1 ||
        b[1].get<int64_t>() < 1)
      fail(wat + "block_structure", "must be [rows, columns] of positive integers, got " + b.dump());
    out.block = {b[0].get<int64_t>(), b[1].get<int64_t>()};
  }
  if (w.contains("strategy") && !w["strategy"].is_null()) {
    if (!w["strategy"].is_string()) fail(wat + "strategy", "must be a string, got " + w["strategy"].dump());
    out.strategy = w["strategy"].get<std::string>();
  } else {  // as compressed-tensors infers it
    out.strategy = out.group_size > 0 ? "group" : !out.block.empty() ? "block" : "tensor";
  }
  if (!kStrategies.count(out.strategy)) fail(wat + "strategy", "'" + out.strategy + "' is not read (tensor, channel, group, tensor_group, block)");
  if ((out.strategy == "group" || out.strategy == "tensor_group") && out.group_size < 1) fail(wat + "group_size", "is needed by the strategy " + out.strategy);
  if (out.strategy == "block" && out.block.empty()) fail(wat + "block_structure", "is needed by the strategy block");
  // What each format stores.
  const bool fp = out.type == "float";
  if (out.format == "pack-quantized" && fp) fail(wat + "type", "must be \"int\" for pack-quantized");
  if ((out.format == "int-quantized" && (fp || out.bits != 8)) || (out.format == "float-quantized" && (!fp || out.bits != 8)) ||
      (out.format == "naive-quantized" && fp && out.bits != 8))
    fail(wat + "num_bits", detail::concat(out.bits, "-bit ", out.type, "s are not what ", out.format, " stores"));
  if (out.format == "nvfp4-pack-quantized" && (!fp || out.bits != 4 || out.group_size != 16 || !out.symmetric))
    fail(wat.substr(0, wat.size() - 1), "must be symmetric 4-bit floats by groups of 16 for nvfp4-pack-quantized");
  if (fp && !out.symmetric) fail(wat + "symmetric", "must be true for floats");
  return out;
}

// Whether the target `t` names the module `module` (a name or a "re:" pattern matching from its start).
bool names(const std::string& t, const std::string& module) {
  if (t.rfind("re:", 0) == 0) return std::regex_search(module, std::regex(t.substr(3)), std::regex_constants::match_continuous);
  return t == module;
}

// `s` (a scale or zero point of the group's grid) widened to [rows, cols].
at::Tensor widen(const HfCompressedGroup& g, const at::Tensor& s, int64_t rows, int64_t cols, const std::string& what,
                 const char* of) {
  auto wrong = [&](const std::string& expected) -> void {
    throw ConfigError(detail::concat(what, ": its ", of, " have shape ", s.sizes(), "; the strategy ", g.strategy, " of a [", rows, ", ", cols,
                                     "] weight makes ", expected));
  };
  if (g.strategy == "tensor") {
    if (s.numel() != 1) wrong("one value");
    return s.reshape({});
  }
  if (g.strategy == "channel") {
    if (s.numel() != rows || (s.dim() == 2 && s.size(0) != rows)) wrong(detail::concat("[", rows, ", 1]"));
    return s.reshape({rows, 1});
  }
  if (g.strategy == "block") {
    const int64_t r = (rows + g.block[0] - 1) / g.block[0], c = (cols + g.block[1] - 1) / g.block[1];
    if (s.dim() != 2 || s.size(0) != r || s.size(1) != c) wrong(detail::concat("[", r, ", ", c, "] (blocks of ", g.block[0], "x", g.block[1], ")"));
    return s.repeat_interleave(g.block[0], 0).narrow(0, 0, rows).repeat_interleave(g.block[1], 1).narrow(1, 0, cols);
  }
  if (cols % g.group_size != 0)  // group, tensor_group
    throw ConfigError(detail::concat(what, ": ", cols, " columns are not groups of ", g.group_size));
  const int64_t n = cols / g.group_size;
  if (s.dim() != 2 || s.size(0) != rows || s.size(1) != n) wrong(detail::concat("[", rows, ", ", n, "] (groups of ", g.group_size, ")"));
  return s.repeat_interleave(g.group_size, 1);
}

}  // namespace


HfQuantization read_compressed_tensors(const json& q, const std::string& where) {
  const std::string at = "quantization_config.";
  auto fail = [&](const std::string& key, const std::string& msg) -> void { throw ConfigError(where + ": " + at + key + " " + msg); };
  HfQuantization out;
  out.method = "compressed-tensors";
  if (q.contains("quantization_status") && q["quantization_status"] != "compressed")
    fail("quantization_status", q["quantization_status"].dump() + " is not read (\"compressed\": weights stored as their format says)");
  for (const char* key : {"sparsity_config", "transform_config"})
    if (q.contains(key) && !q[key].is_null() && !(q[key].is_object() && (q[key].empty() || q[key].value("format", "") == "dense")))
      fail(key, "is not read (sparse or rotated weights compute a different model; dense weights are read)");
  const std::string format = q.value("format", std::string("dense"));
  const auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->empty()) fail("config_groups", "must name the groups of quantized modules");
  for (const auto& [name, g] : groups->items()) {
    if (!g.is_object()) fail("config_groups." + name, "must be an object, got " + g.dump());
    if (!g.contains("weights") || g["weights"].is_null()) continue;  // quantizes activations only: the weights are stored as they are
    if (!g["weights"].is_object()) fail("config_groups." + name + ".weights", "must be an object, got " + g["weights"].dump());
    out.groups.push_back(read_group(name, g, format, at + "config_groups." + name + ".", where));
  }
  return out;
}

bool compressed_in(const SafetensorsCheckpoint& ck, const std::string& name) {
  return ck.contains(name + "_packed") || ck.contains(name + "_scale");
}

at::Tensor read_compressed(const SafetensorsCheckpoint& ck, const HfQuantization& q, const std::string& name,
                           std::vector<std::string>* from, const std::string& where) {
  const bool packed = ck.contains(name + "_packed");
  const std::string stored = packed ? name + "_packed" : name;
  const std::string what = detail::concat(where, ": ", ck.file_of(stored), ": tensor '", stored, "'");
  const std::string suffix = ".weight";
  const bool weight = name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  const std::string module = weight ? name.substr(0, name.size() - suffix.size()) : name;
  const HfCompressedGroup& g = compressed_group(q, module, what);
  if (ck.contains(name + "_g_idx"))
    throw ConfigError(what + ": its activation-order indices ('" + name + "_g_idx') are not read (compressed-tensors no longer writes them)");
  auto need = [&](const std::string& n) {
    if (!ck.contains(n)) throw ConfigError(detail::concat(what, " is quantized (", g.format, ", group ", g.name, ") and its '", n, "' is missing"));
    from->push_back(n);
    return ck.get(n);
  };
  auto maybe = [&](const std::string& n) {
    if (!ck.contains(n)) return at::Tensor();
    from->push_back(n);
    return ck.get(n);
  };
  HfCompressedParts parts;
  from->clear();
  if (g.format == "pack-quantized" || g.format == "nvfp4-pack-quantized") {
    parts.packed = need(name + "_packed");
    if (g.format == "pack-quantized") parts.shape = need(name + "_shape");
  } else {
    parts.weight = need(name);
  }
  parts.scale = need(name + "_scale");
  parts.zero_point = g.symmetric ? maybe(name + "_zero_point") : need(name + "_zero_point");
  parts.global_scale = g.format == "nvfp4-pack-quantized" ? need(name + "_global_scale") : maybe(name + "_global_scale");
  return dequantize_compressed(g, parts, what);
}

const HfCompressedGroup& compressed_group(const HfQuantization& q, const std::string& module, const std::string& what) {
  std::vector<const HfCompressedGroup*> by_name, by_class;
  for (const HfCompressedGroup& g : q.groups)
    for (const std::string& t : g.targets) {
      if (names(t, module)) {
        by_name.push_back(&g);
        break;
      }
      if (t == "Linear") {
        by_class.push_back(&g);
        break;
      }
    }
  const auto& fits = by_name.empty() ? by_class : by_name;
  if (fits.size() == 1) return *fits[0];
  if (fits.empty())
    throw ConfigError(what + " is quantized, and no group of quantization_config.config_groups targets '" + module + "' (by name or as a Linear)");
  throw ConfigError(what + ": the groups " + fits[0]->name + " and " + fits[1]->name + " of quantization_config.config_groups both target '" +
                    module + "'");
}

at::Tensor unpack_compressed_ints(const at::Tensor& packed, int64_t bits, int64_t cols, const std::string& what) {
  if (packed.scalar_type() != at::kInt || packed.dim() != 2)
    throw ConfigError(detail::concat(what, ": packed integers are int32 [rows, words], got ", packed.scalar_type(), " ", packed.sizes()));
  const int64_t words = (cols * bits + 31) / 32;
  if (packed.size(1) != words)
    throw ConfigError(detail::concat(what, ": ", cols, " values of ", bits, " bits take ", words, " words a row, not ", packed.size(1)));
  // The words as unsigned, with a zero word after each row's last for values that straddle it.
  const at::Tensor w = torch::cat({packed.to(torch::kLong).bitwise_and(0xFFFFFFFFLL), torch::zeros({packed.size(0), 1}, torch::kLong)}, 1);
  const at::Tensor start = torch::arange(cols, torch::kLong) * bits;
  const at::Tensor word = start.div(32, "floor"), offset = start.remainder(32);
  const int64_t mask = (int64_t{1} << bits) - 1;
  const at::Tensor low = w.index_select(1, word).bitwise_right_shift(offset);
  const at::Tensor high = w.index_select(1, word + 1).bitwise_and(mask).bitwise_left_shift(32 - offset);
  return low.bitwise_or(high).bitwise_and(mask) - (int64_t{1} << (bits - 1));
}

at::Tensor dequantize_compressed(const HfCompressedGroup& g, const HfCompressedParts& p, const std::string& what) {
  if (!p.scale.defined() || !p.scale.is_floating_point())
    throw ConfigError(detail::concat(what, ": its scales are ", p.scale.defined() ? c10::toString(p.scale.scalar_type()) : "missing",
                                     ", not floating point"));
  if (g.format == "nvfp4-pack-quantized") {
    if (p.packed.scalar_type() != at::kByte || p.packed.dim() != 2)
      throw ConfigError(detail::concat(what, ": NVFP4 codes are bytes [rows, columns / 2], got ", p.packed.scalar_type(), " ", p.packed.sizes()));
    if (!p.global_scale.defined() || p.global_scale.numel() != 1 || !p.global_scale.is_floating_point())
      throw ConfigError(what + ": NVFP4 needs one floating-point global scale");
    const at::Tensor codes = fp4_values(p.packed);
    // compressed-tensors: the codes and scales in bfloat16, scale / global scale and the product in
    // float32, the weight rounded to bfloat16.
    const at::Tensor s = p.scale.to(torch::kFloat) / p.global_scale.to(torch::kFloat).reshape({1});
    return (codes * widen(g, s, codes.size(0), codes.size(1), what, "scales")).to(torch::kBFloat16);
  }
  at::Tensor q;
  bool packed_zero_points = false;
  if (g.format == "pack-quantized") {
    if (!p.shape.defined() || p.shape.numel() != 2 || p.shape.is_floating_point())
      throw ConfigError(what + ": its weight_shape must hold two integers [rows, columns]");
    const at::Tensor shape = p.shape.to(torch::kLong);
    const int64_t rows = shape[0].item<int64_t>(), cols = shape[1].item<int64_t>();
    q = unpack_compressed_ints(p.packed, g.bits, cols, what);
    if (q.size(0) != rows) throw ConfigError(detail::concat(what, ": ", q.size(0), " packed rows, weight_shape says ", rows));
    packed_zero_points = !g.symmetric && (g.strategy == "group" || g.strategy == "channel");
  } else {
    q = p.weight;
    const bool ok = g.type == "float" ? (q.scalar_type() == at::kFloat8_e4m3fn || q.scalar_type() == at::kFloat8_e5m2)
                                      : (q.scalar_type() == at::kChar || q.scalar_type() == at::kByte);
    if (!ok || q.dim() != 2)
      throw ConfigError(detail::concat(what, ": ", g.format, " of ", g.bits, "-bit ", g.type, "s stores them in ",
                                       g.type == "float" ? "float8" : "int8", " matrices, got ", q.scalar_type(), " ", q.sizes()));
  }
  const int64_t rows = q.size(0), cols = q.size(1);
  const at::ScalarType type = p.scale.scalar_type();  // compressed-tensors dequantizes in the scale's type
  at::Tensor w = q.to(type);
  if (p.zero_point.defined()) {
    at::Tensor z = p.zero_point;
    if (packed_zero_points) {  // packed along the rows: [words, groups]
      const int64_t groups = p.scale.dim() == 2 ? p.scale.size(1) : 1;
      z = unpack_compressed_ints(z.dim() == 2 ? z.t().contiguous() : z, g.bits, rows, what + "'s zero points").t().reshape({rows, groups});
    }
    w = w - widen(g, z.to(type), rows, cols, what, "zero points");
  }
  const at::Tensor s = p.global_scale.defined() ? p.scale / p.global_scale.to(type) : p.scale;
  return w * widen(g, s, rows, cols, what, "scales");
}

}  // namespace pipetrain::models
