// data.kind "tensors": inputs and targets written by Python (job/tensors_data.h).
#include "job/tensors_data.h"
#include "job/npy.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <torch/serialize.h>
#include <torch/torch.h>

#include "common/error.h"
#include "common/strings.h"

namespace pipetrain::job {

namespace {

constexpr int64_t kMaxPickle = int64_t{16} << 30;          // a torch.save file read whole: 16 GiB

[[noreturn]] void bad(const std::string& file, const std::string& what) { throw DataError(printable(file, 300) + ": " + what); }

// An .npy array memory-mapped (job/npy.h): little-endian numbers, bytes and booleans.
at::Tensor read_npy(const std::string& file) {
  const NpyHeader h = read_npy_header(file);
  static const std::map<std::string, at::ScalarType> kTypes{
      {"'<f4'", at::kFloat}, {"'<f8'", at::kDouble}, {"'<f2'", at::kHalf}, {"'|u1'", at::kByte}, {"'<u1'", at::kByte},
      {"'|i1'", at::kChar},  {"'<i2'", at::kShort},  {"'<i4'", at::kInt},   {"'<i8'", at::kLong}, {"'|b1'", at::kBool}};
  const auto type = kTypes.find(h.descr);
  if (type == kTypes.end())
    bad(file, "holds dtype " + h.descr + "; float16/32/64, int8/16/32/64, uint8 and bool (little-endian) are read");
  const int64_t bytes = h.count * static_cast<int64_t>(c10::elementSize(type->second));
  if (h.file_size < h.offset + bytes)
    bad(file, "truncated: " + std::to_string(h.file_size) + " bytes, its header describes " + std::to_string(h.offset + bytes));
  return map_file(file, h.offset, h.shape, type->second);
}

// A file written by torch.save: a dict of named tensors, read through libtorch's unpickler.
std::map<std::string, at::Tensor> read_saved(const std::string& file) {
  const int64_t size = regular_file_size(file);
  if (size > kMaxPickle) bad(file, "larger than 16 GiB; save the arrays as .npy files in a folder, which are memory-mapped");
  std::vector<char> bytes(static_cast<size_t>(size));
  std::ifstream in(file, std::ios::binary);
  if (!in.read(bytes.data(), size)) bad(file, "cannot read");
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    std::string what = e.what();
    bad(file, "not a file saved by torch.save (" + printable(what.substr(0, what.find('\n')), 160) + ")");
  }
  if (!value.isGenericDict()) bad(file, "holds a " + value.tagKind() + ", not a dict of tensors ({\"inputs\": ..., \"targets\": ...})");
  std::map<std::string, at::Tensor> out;
  for (const auto& item : value.toGenericDict()) {
    if (!item.key().isString()) bad(file, "a key that is not a string");
    if (!item.value().isTensor()) bad(file, "'" + item.key().toStringRef() + "' is a " + item.value().tagKind() + ", not a tensor");
    out[item.key().toStringRef()] = item.value().toTensor();
  }
  return out;
}

// A file or folder without the tensor `key`: which names it does hold.
[[noreturn]] void missing(const std::string& path, bool folder, const std::map<std::string, at::Tensor>& t,
                          const std::string& key) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : t) keys.push_back(k);
  throw DataError(printable(path, 300) + ": no '" + key + "' " +
                  (folder ? std::string("array (inputs.npy and targets.npy are read)")
                          : "tensor (keys: " + (keys.empty() ? std::string("none") : join(keys, ", ")) + ")"));
}

}  // namespace

std::vector<int64_t> tensors_sample_shape(const Config& c) {
  const std::string& path = c.data.path;
  if (std::filesystem::is_directory(path)) {
    const std::string f = path + "/inputs.npy";
    if (!std::filesystem::exists(f)) missing(path, true, {}, "inputs");
    const NpyHeader h = read_npy_header(f);
    return std::vector<int64_t>(h.shape.begin() + 1, h.shape.end());
  }
  const std::map<std::string, at::Tensor> t = read_saved(path);
  const auto inputs = t.find("inputs");
  if (inputs == t.end()) missing(path, false, t, "inputs");
  if (inputs->second.dim() < 1) throw DataError(printable(path, 300) + ": 'inputs': a scalar, not one row per sample");
  return inputs->second.sizes().slice(1).vec();
}

Dataset load_tensors(const Config& c, const models::Model& model) {
  const std::string& path = c.data.path;
  std::map<std::string, at::Tensor> t;
  const bool folder = std::filesystem::is_directory(path);
  if (folder) {
    for (const char* key : {"inputs", "targets", "test_inputs", "test_targets"}) {
      const std::string f = path + "/" + key + ".npy";
      if (std::filesystem::exists(f)) t[key] = read_npy(f);
    }
  } else {
    t = read_saved(path);
  }
  auto name_of = [&](const std::string& key) { return folder ? path + "/" + key + ".npy" : path + ": '" + key + "'"; };
  for (const char* key : {"inputs", "targets"})
    if (!t.count(key)) missing(path, folder, t, key);
  if (t.count("test_inputs") != t.count("test_targets"))
    throw DataError(printable(path, 300) + ": test_inputs and test_targets come together (one is missing)");
  auto check = [&](const std::string& in, const std::string& out) {
    const at::Tensor& x = t[in];
    at::Tensor& y = t[out];
    if (x.dim() < 1 || y.dim() < 1) throw DataError(name_of(x.dim() < 1 ? in : out) + ": a scalar, not one row per sample");
    if (x.size(0) != y.size(0))
      throw DataError(detail::concat(name_of(in), " holds ", x.size(0), " samples but ", name_of(out), " ", y.size(0)));
    if (model.token_input ? x.is_floating_point() : x.scalar_type() == at::kBool)
      throw DataError(name_of(in) + ": " + std::string(c10::toString(x.scalar_type())) +
                      (model.token_input ? ", but the model takes token ids (integers)" : ", not numbers"));
    if (y.is_floating_point() || y.scalar_type() == at::kBool)
      throw DataError(name_of(out) + ": " + std::string(c10::toString(y.scalar_type())) + ", not class ids (integers)");
    y = y.to(at::kLong);
    if (y.numel() > 0 && y.min().item<int64_t>() < 0) throw DataError(name_of(out) + ": a negative class id");
  };
  check("inputs", "targets");
  Dataset d;
  d.name = "tensors (" + printable(path, 120) + ")";
  d.tokens = model.token_input;
  d.sample_shape.assign(t["inputs"].sizes().begin() + 1, t["inputs"].sizes().end());
  if (t.count("test_inputs")) {
    check("test_inputs", "test_targets");
    if (t["test_inputs"].sizes().slice(1).vec() != t["inputs"].sizes().slice(1).vec())
      throw DataError(detail::concat(name_of("test_inputs"), ": samples of shape ", t["test_inputs"].sizes().slice(1),
                                     ", the training ones ", t["inputs"].sizes().slice(1)));
    d.train = {t["inputs"], t["targets"]};
    d.test = {t["test_inputs"], t["test_targets"]};
  } else {  // the last share of the samples is the test split
    const int64_t n = t["inputs"].size(0), test = static_cast<int64_t>(static_cast<double>(n) * c.data.test_fraction);
    d.train = {t["inputs"].narrow(0, 0, n - test), t["targets"].narrow(0, 0, n - test)};
    d.test = {t["inputs"].narrow(0, n - test, test), t["targets"].narrow(0, n - test, test)};
  }
  d.classes = 0;
  for (const Split* s : {&d.train, &d.test})
    if (s->targets.numel() > 0) d.classes = std::max(d.classes, s->targets.max().item<int64_t>() + 1);
  d.widen_inputs = !model.token_input && !t["inputs"].is_floating_point();
  return d;
}

}  // namespace pipetrain::job
