// One safetensors file: the header checked against the bytes, the mapping, the writer
// (models/safetensors.h). Sharded checkpoints: models/safetensors_index.cpp.
#include "models/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/atomic_file.h"
#include "common/json_reader.h"
#include "common/strings.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors holds little-endian bytes, read here as they are");

namespace pipetrain::models {

namespace {

struct DtypeRow {
  const char* name;
  at::ScalarType type;
};
// One row per dtype, both directions.
const DtypeRow kDtypes[] = {
    {"F64", at::kDouble},  {"F32", at::kFloat},   {"F16", at::kHalf},     {"BF16", at::kBFloat16},
    {"I64", at::kLong},    {"I32", at::kInt},     {"I16", at::kShort},    {"I8", at::kChar},
    {"U8", at::kByte},     {"BOOL", at::kBool},   {"U16", at::kUInt16},   {"U32", at::kUInt32},
    {"U64", at::kUInt64},  {"F8_E4M3", at::kFloat8_e4m3fn}, {"F8_E5M2", at::kFloat8_e5m2},
    {"F8_E8M0", at::kFloat8_e8m0fnu}, {"C64", at::kComplexFloat}};

std::string in_quotes(const std::string& name) { return "'" + printable(name, 120) + "'"; }

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw SafetensorsError(printable(file, 300) + ": " + what);
}
[[noreturn]] void fail(const std::string& file, const std::string& tensor, const std::string& what) {
  throw SafetensorsError(printable(file, 300) + ": tensor " + in_quotes(tensor) + ": " + what);
}

using u128 = unsigned __int128;
constexpr u128 kHuge = u128{1} << 62;  // more bytes than any file: a size that large is refused

uint64_t read_u64(const char* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return v;
}

// A non-negative integer of JSON below 2^62 (so sums and products of a few stay in range).
bool small_uint(const nlohmann::json& v, uint64_t* out) {
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
  } else {
    const int64_t s = v.get<int64_t>();
    if (s < 0) return false;
    *out = static_cast<uint64_t>(s);
  }
  return *out < (uint64_t{1} << 62);
}

SafetensorsEntry parse_entry(const std::string& file, const std::string& name, const nlohmann::json& v) {
  if (!v.is_object()) fail(file, name, "its header entry is " + describe(v) + ", not an object");
  SafetensorsEntry e;
  e.name = name;
  for (const auto& [key, value] : v.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets") fail(file, name, "unknown key " + in_quotes(key));
  const auto dtype = v.find("dtype");
  if (dtype == v.end() || !dtype->is_string()) fail(file, name, "no dtype (a string)");
  e.dtype = dtype->get<std::string>();
  if (!safetensors_type(e.dtype, &e.type))
    fail(file, name, "dtype " + in_quotes(e.dtype) + " is not one read here (F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL U16 U32 U64 F8_E4M3 F8_E5M2 F8_E8M0 C64)");
  const auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array()) fail(file, name, "no shape (an array)");
  if (shape->size() > 64) fail(file, name, "a shape of " + std::to_string(shape->size()) + " dimensions");
  u128 bytes = c10::elementSize(e.type), strides = 1;
  for (const auto& d : *shape) {
    uint64_t n = 0;
    if (!small_uint(d, &n)) fail(file, name, "shape " + brief(*shape) + " has a dimension that is not a size");
    e.shape.push_back(static_cast<int64_t>(n));
    bytes *= n;
    if (bytes > kHuge) bytes = kHuge;  // refused below
    // An empty tensor's other dimensions still make its strides: libtorch refuses them past int64.
    strides *= std::max<uint64_t>(n, 1);
    if (strides > kHuge) fail(file, name, "shape " + brief(*shape) + " multiplies past 2^62 (its strides)");
  }
  const auto offsets = v.find("data_offsets");
  if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 || !small_uint((*offsets)[0], &e.begin) ||
      !small_uint((*offsets)[1], &e.end))
    fail(file, name, "no data_offsets (two byte offsets [begin, end))");
  if (e.end < e.begin) fail(file, name, "data_offsets " + brief(*offsets) + " end before they begin");
  if (static_cast<u128>(e.end - e.begin) != bytes)
    fail(file, name, "data_offsets " + brief(*offsets) + " span " + std::to_string(e.end - e.begin) + " bytes, but " +
                         e.dtype + " of shape " + brief(*shape) + " is " +
                         (bytes >= kHuge ? std::string("more than 2^62")
                                                                 : std::to_string(static_cast<uint64_t>(bytes))) +
                         " bytes");
  return e;
}

// BOOL holds 0 or 1 in each byte; another value is no bool (and undefined behaviour to read as one).
void check_bools(const std::string& file, const SafetensorsEntry& e, const char* data) {
  for (uint64_t i = e.begin; i < e.end; ++i)
    if (static_cast<unsigned char>(data[i]) > 1)
      fail(file, e.name, "BOOL byte " + std::to_string(i - e.begin) + " is " +
                             std::to_string(static_cast<unsigned char>(data[i])) + ", not 0 or 1");
}

}  // namespace

nlohmann::json parse_unique_json(const std::string& text, const std::string& source) {
  // One set of keys per open object: nlohmann keeps the last of two equal keys without a word.
  std::vector<std::set<std::string>> open;
  const nlohmann::json::parser_callback_t check = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (depth > 8) throw SafetensorsError(printable(source, 300) + ": JSON nested deeper than 8 levels");
    if (event == nlohmann::json::parse_event_t::object_start) open.emplace_back();
    if (event == nlohmann::json::parse_event_t::object_end && !open.empty()) open.pop_back();
    if (event == nlohmann::json::parse_event_t::key && !open.empty() && !open.back().insert(parsed.get<std::string>()).second)
      throw SafetensorsError(printable(source, 300) + ": the key " + in_quotes(parsed.get<std::string>()) + " appears twice");
    return true;
  };
  try {
    return nlohmann::json::parse(text, check);
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    const auto pos = what.find("] ");
    throw SafetensorsError(printable(source, 300) + ": invalid JSON: " +
                           printable(pos == std::string::npos ? what : what.substr(pos + 2), 200));
  }
}

bool safetensors_type(const std::string& dtype, at::ScalarType* type) {
  for (const auto& row : kDtypes)
    if (dtype == row.name) {
      *type = row.type;
      return true;
    }
  return false;
}

std::string safetensors_dtype(at::ScalarType type, const std::string& what) {
  for (const auto& row : kDtypes)
    if (type == row.type) return row.name;
  throw SafetensorsError(what + ": dtype " + std::string(c10::toString(type)) + " has no safetensors name");
}

const SafetensorsEntry* SafetensorsHeader::find(const std::string& name) const {
  const auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : &entries[it->second];
}

SafetensorsHeader parse_safetensors(const char* bytes, uint64_t size, const std::string& file) {
  if (size < 8) fail(file, "too short for a safetensors file (" + std::to_string(size) + " bytes; its header length alone is 8)");
  const uint64_t n = read_u64(bytes);
  if (n > kMaxSafetensorsHeader)
    fail(file, "a header of " + std::to_string(n) + " bytes (at most " + std::to_string(kMaxSafetensorsHeader) + " are read)");
  if (n > size - 8) fail(file, "a header of " + std::to_string(n) + " bytes in a file of " + std::to_string(size));
  if (n < 2 || bytes[8] != '{') fail(file, "the header is not a JSON object (it must start with '{')");
  const std::string text(bytes + 8, static_cast<size_t>(n));
  const nlohmann::json header = parse_unique_json(text, file);
  if (!header.is_object()) fail(file, "the header is not a JSON object");
  SafetensorsHeader h;
  h.data_start = 8 + n;
  const uint64_t data_size = size - h.data_start;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) fail(file, "__metadata__ is " + describe(value) + ", not an object of strings");
      for (const auto& [key, text_value] : value.items()) {
        if (!text_value.is_string()) fail(file, "__metadata__ " + in_quotes(key) + " is " + describe(text_value) + ", not a string");
        h.metadata[key] = text_value.get<std::string>();
      }
      continue;
    }
    h.entries.push_back(parse_entry(file, name, value));
  }
  // The bytes are tiled: sorted by offset, each tensor starts where the one before ends, the first
  // at 0, and the last ends at the end of the file.
  std::stable_sort(h.entries.begin(), h.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  const SafetensorsEntry* before = nullptr;
  for (const auto& e : h.entries) {
    if (e.begin < at)
      fail(file, e.name, "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ") overlap tensor " +
                             in_quotes(before->name) + " [" + std::to_string(before->begin) + ", " +
                             std::to_string(before->end) + ")");
    if (e.begin > at)
      fail(file, e.name, "data_offsets begin at " + std::to_string(e.begin) + ", leaving bytes [" + std::to_string(at) +
                             ", " + std::to_string(e.begin) + ") of the data to no tensor");
    if (e.end > data_size)
      fail(file, e.name, "data_offsets end at " + std::to_string(e.end) + ", past the " + std::to_string(data_size) +
                             " bytes of data after the header");
    at = e.end;
    before = &e;
  }
  if (at != data_size)
    fail(file, std::to_string(data_size - at) + " bytes after the last tensor's data (the header accounts for " +
                   std::to_string(at) + " of " + std::to_string(data_size) + ")");
  for (size_t i = 0; i < h.entries.size(); ++i) {
    h.by_name[h.entries[i].name] = i;
    if (h.entries[i].type == at::kBool) check_bools(file, h.entries[i], bytes + h.data_start);
  }
  return h;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  // Non-blocking: a FIFO opens at once (and is refused below) instead of waiting for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(path, std::string("cannot open (") + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    fail(path, "too short for a safetensors file (" + std::to_string(size) + " bytes; its header length alone is 8)");
  }
  // Private and writable: a tensor written in place copies its page; the file never changes.
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (base == MAP_FAILED) fail(path, std::string("cannot map (") + std::strerror(map_errno) + ")");
  mapping_ = std::shared_ptr<void>(base, [size](void* p) { ::munmap(p, size); });
  base_ = static_cast<const char*>(base);
  header_ = parse_safetensors(base_, size, path);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& e : header_.entries) out.push_back(e.name);
  return out;
}

bool SafetensorsFile::is_view(const std::string& name) const {
  const SafetensorsEntry* e = header_.find(name);
  if (!e || e->end == e->begin) return false;
  const auto address = reinterpret_cast<uintptr_t>(base_ + header_.data_start + e->begin);
  return address % c10::elementSize(e->type) == 0;
}

at::Tensor SafetensorsFile::get(const std::string& name) const {
  const SafetensorsEntry* e = header_.find(name);
  if (!e) fail(path_, name, "not in the file");
  const auto options = at::TensorOptions().dtype(e->type);
  if (e->end == e->begin) return torch::empty(e->shape, options);
  char* data = const_cast<char*>(base_) + header_.data_start + e->begin;
  if (is_view(name)) {
    std::shared_ptr<void> keep = mapping_;
    return torch::from_blob(data, e->shape, [keep](void*) mutable { keep.reset(); }, options);
  }
  at::Tensor copy = torch::empty(e->shape, options);
  std::memcpy(copy.data_ptr(), data, e->end - e->begin);
  return copy;
}

NamedTensors SafetensorsFile::all() const {
  NamedTensors out;
  for (const auto& e : header_.entries) out.emplace_back(e.name, get(e.name));
  return out;
}

std::string safetensors_bytes(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata,
                              const std::string& file) {
  std::set<std::string> seen;
  std::vector<std::pair<std::string, at::Tensor>> order;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") fail(file, name, "a reserved name");
    if (!seen.insert(name).second) fail(file, name, "given twice");
    if (!t.defined()) fail(file, name, "an undefined tensor");
    if (t.layout() != at::kStrided) fail(file, name, "a sparse tensor (only dense ones are written)");
    safetensors_dtype(t.scalar_type(), printable(file, 300) + ": tensor " + in_quotes(name));
    order.emplace_back(name, t.detach().to(at::kCPU).contiguous());
  }
  // Largest item first: every offset is then a multiple of each tensor's item size.
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second.element_size() > b.second.element_size();
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t at = 0;
  for (const auto& [name, t] : order) {
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", safetensors_dtype(t.scalar_type(), name)}, {"shape", t.sizes().vec()}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text;
  try {
    text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  } catch (const nlohmann::json::exception&) {
    fail(file, "a tensor name or metadata that is not UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8 + text.size() + at, '\0');
  const uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  char* data = out.data() + 8 + text.size();
  for (const auto& [name, t] : order) {
    const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
    if (bytes) std::memcpy(data, t.data_ptr(), bytes);
    data += bytes;
  }
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  const std::string bytes = safetensors_bytes(tensors, metadata, path);
  write_file_atomically(path, bytes.data(), bytes.size());
}

}  // namespace pipetrain::models
