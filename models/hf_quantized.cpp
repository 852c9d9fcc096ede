#include "models/hf_quantized.h"

#include <utility>

#include <torch/torch.h>

#include "common/error.h"
#include "common/strings.h"

namespace pipetrain::models {

namespace {

using json = nlohmann::json;

bool float8(at::ScalarType t) {
  return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2 || t == at::kFloat8_e4m3fnuz || t == at::kFloat8_e5m2fnuz ||
         t == at::kFloat8_e8m0fnu;
}

// Scales as float32: bytes are UE8M0 exponents (2^(b - 127)), any floating type is widened.
at::Tensor scales_as_float(const at::Tensor& s, const std::string& what) {
  if (s.scalar_type() == at::kByte) return torch::exp2(s.to(torch::kFloat) - 127.0);
  if (!s.is_floating_point()) throw ConfigError(detail::concat(what, ": its scales are ", s.scalar_type(), ", not floating point or bytes"));
  return s.to(torch::kFloat);
}

}  // namespace

HfQuantization read_hf_quantization(const json& q, const std::string& where) {
  auto fail = [&](const std::string& key, const std::string& msg) -> void { throw ConfigError(where + ": " + key + " " + msg); };
  if (!q.is_object()) fail("quantization_config", "must be an object, got " + q.dump());
  const std::string at = "quantization_config.";
  const auto method = q.find("quant_method");
  if (method == q.end() || !method->is_string()) fail(at + "quant_method", "must name the method (fp8, mxfp4 or compressed-tensors)");
  HfQuantization out;
  out.method = method->get<std::string>();
  if (out.method == "compressed-tensors") return read_compressed_tensors(q, where);
  if (out.method != "fp8" && out.method != "mxfp4")
    fail(at + "quant_method", "'" + out.method +
                                  "' is not supported (fp8, mxfp4 and compressed-tensors are read, dequantized; dequantize others to bfloat16 first)");
  if (q.contains("modules_to_not_convert") && !q["modules_to_not_convert"].is_null() && !q["modules_to_not_convert"].is_array())
    fail(at + "modules_to_not_convert", "must be a list of module names, got " + q["modules_to_not_convert"].dump());
  if (out.method == "mxfp4") return out;
  if (q.contains("fmt") && q["fmt"] != "e4m3") fail(at + "fmt", q["fmt"].dump() + " is not supported (e4m3)");
  if (q.contains("activation_scheme") && q["activation_scheme"] != "dynamic")
    fail(at + "activation_scheme", q["activation_scheme"].dump() + " is not supported (dynamic: the weights alone are quantized)");
  const auto block = q.find("weight_block_size");
  if (block == q.end()) {
    out.block = {128, 128};  // transformers' default
  } else if (!block->is_null()) {
    if (!block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() || !(*block)[1].is_number_integer() ||
        (*block)[0].get<int64_t>() < 1 || (*block)[1].get<int64_t>() < 1)
      fail(at + "weight_block_size", "must be [rows, columns] of positive integers (or null: one scale a tensor), got " + block->dump());
    out.block = {(*block)[0].get<int64_t>(), (*block)[1].get<int64_t>()};
  }
  return out;
}

at::Tensor dequantize_fp8(const at::Tensor& q, const at::Tensor& scale, const std::vector<int64_t>& block, const std::string& what) {
  const at::Tensor s = scales_as_float(scale, what);
  const at::Tensor w = q.to(torch::kFloat);
  if (block.empty()) {
    if (s.numel() != 1) throw ConfigError(detail::concat(what, ": its scale has shape ", s.sizes(), ", one value (weight_block_size is null)"));
    return w * s.reshape({});
  }
  if (q.dim() < 2) throw ConfigError(detail::concat(what, ": a quantized tensor of shape ", q.sizes(), " (fp8 blocks need a matrix)"));
  const int64_t rows = q.size(-2), cols = q.size(-1);
  std::vector<int64_t> grid(q.sizes().begin(), q.sizes().end() - 2);
  grid.push_back((rows + block[0] - 1) / block[0]);
  grid.push_back((cols + block[1] - 1) / block[1]);
  if (s.sizes() != at::IntArrayRef(grid))
    throw ConfigError(detail::concat(what, ": its scales have shape ", s.sizes(), ", blocks of ", block[0], "x", block[1], " of ",
                                     q.sizes(), " make ", at::IntArrayRef(grid)));
  const at::Tensor wide = s.repeat_interleave(block[0], -2).narrow(-2, 0, rows).repeat_interleave(block[1], -1).narrow(-1, 0, cols);
  return w * wide;
}

at::Tensor dequantize_mxfp4(const at::Tensor& blocks, const at::Tensor& scales, const std::string& what) {
  if (blocks.scalar_type() != at::kByte || scales.scalar_type() != at::kByte)
    throw ConfigError(detail::concat(what, ": MXFP4 blocks and scales are bytes (U8), got ", blocks.scalar_type(), " and ", scales.scalar_type()));
  if (blocks.dim() < 2 || blocks.size(-1) != 16 || blocks.sizes().slice(0, blocks.dim() - 1) != scales.sizes())
    throw ConfigError(detail::concat(what, ": MXFP4 blocks of shape ", blocks.sizes(), " and scales of shape ", scales.sizes(),
                                     " (blocks [..., groups, 16] beside scales [..., groups])"));
  const at::Tensor out = fp4_values(blocks) * torch::exp2(scales.to(torch::kFloat) - 127.0).unsqueeze(-1);
  return out.flatten(-2);
}

at::Tensor fp4_values(const at::Tensor& bytes) {
  static const float kFp4[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  const at::Tensor lut = torch::from_blob(const_cast<float*>(kFp4), {16}, torch::kFloat).clone();
  const at::Tensor b = bytes.to(torch::kLong);
  // Each byte's low half is the even element, its high half the odd one.
  return torch::stack({lut.index({b.bitwise_and(15)}), lut.index({b.bitwise_right_shift(4)})}, -1).flatten(-2);
}

HfWeights::HfWeights(const SafetensorsCheckpoint& ck, HfQuantization q, std::string where)
    : ck_(ck), q_(std::move(q)), where_(std::move(where)) {}

bool HfWeights::contains(const std::string& name) const {
  return ck_.contains(name) || (q_.method == "mxfp4" && ck_.contains(name + "_blocks")) ||
         (q_.method == "compressed-tensors" && ck_.contains(name + "_packed"));
}

const std::string& HfWeights::file_of(const std::string& name) const {
  if (ck_.contains(name)) return ck_.file_of(name);
  return ck_.file_of(q_.method == "mxfp4" ? name + "_blocks" : q_.method == "compressed-tensors" ? name + "_packed" : name);
}

bool HfWeights::inert(const std::string& name) const {
  if (q_.method != "compressed-tensors") return false;
  for (const char* s : {".input_scale", ".input_zero_point", ".input_global_scale", ".output_scale", ".output_zero_point", ".k_scale",
                        ".v_scale", ".q_scale"}) {
    const size_t n = std::char_traits<char>::length(s);
    if (name.size() > n && name.compare(name.size() - n, n, s) == 0) return true;
  }
  return false;
}

at::Tensor HfWeights::get(const std::string& name, std::vector<std::string>* from) const {
  std::vector<std::string> names;
  if (!from) from = &names;
  for (const Recent& r : recent_)
    if (r.name == name) {
      *from = r.from;
      return r.tensor;
    }
  at::Tensor w = read(name, from);
  if (from->size() > 1) {  // dequantized: kept a while
    if (recent_.size() == 4) recent_.erase(recent_.begin());
    recent_.push_back({name, w, *from});
  }
  return w;
}

at::Tensor HfWeights::read(const std::string& name, std::vector<std::string>* from) const {
  auto what = [&](const std::string& n) { return detail::concat(where_, ": ", ck_.file_of(n), ": tensor '", n, "'"); };
  auto need = [&](const std::string& n, const std::string& of) {
    if (!ck_.contains(n)) throw ConfigError(detail::concat(what(of), " is quantized (", q_.method, ") and its '", n, "' is missing"));
  };
  if (!ck_.contains(name) && q_.method == "mxfp4" && ck_.contains(name + "_blocks")) {
    const std::string blocks = name + "_blocks", scales = name + "_scales";
    need(scales, blocks);
    *from = {blocks, scales};
    const at::Tensor b = ck_.get(blocks);
    if (b.dim() != 4)
      throw ConfigError(detail::concat(what(blocks), " has shape ", b.sizes(), " (MXFP4 is read for stacked experts: [experts, out, groups, 16])"));
    // [experts, out, in] as held, transposed back to transformers' [experts, in, out].
    return dequantize_mxfp4(b, ck_.get(scales), what(blocks)).transpose(1, 2).contiguous();
  }
  if (q_.method == "compressed-tensors" && compressed_in(ck_, name)) return read_compressed(ck_, q_, name, from, where_);
  const at::Tensor w = ck_.get(name);
  *from = {name};
  if (!float8(w.scalar_type())) return w;
  if (q_.method == "compressed-tensors")
    throw ConfigError(detail::concat(what(name), " is ", w.scalar_type(), " and its '", name, "_scale' is missing"));
  if (q_.method != "fp8")
    throw ConfigError(detail::concat(what(name), " is ", w.scalar_type(), ": 8-bit floats need scales, and config.json has no fp8 quantization_config"));
  const std::string scale = name + "_scale_inv";
  need(scale, name);
  from->push_back(scale);
  return dequantize_fp8(w, ck_.get(scale), q_.block, what(name));
}

}  // namespace pipetrain::models
