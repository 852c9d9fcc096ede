// safetensors: the file format in which Hugging Face checkpoints hold their weights, read and
// written by our own small code over the documented format. It lives in models/ because a model
// made from a Hugging Face checkpoint (a family of models/) is its first reader, and it needs
// only common/ and libtorch; checkpoint/ (a layer above) may use it to export.
//
// A file: 8 bytes, the header's length N (little-endian u64); N bytes of JSON mapping each tensor
// name to {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative to the end of the
// header) and an optional "__metadata__" of strings; then the tensors' raw little-endian bytes.
// The reader checks what the reference implementation checks, and a little more: the header's
// length against the file (and at most 100 MB), well-formed UTF-8 JSON with every name once,
// known dtypes, shapes whose bytes (numel x itemsize) equal their offsets' span, and tensors that
// tile the data exactly (no overlap, no gap, nothing past the end); BOOL bytes are 0 or 1. Every
// problem is one SafetensorsError naming the file and, where there is one, the tensor.
//
// A sharded checkpoint is a folder with `model.safetensors.index.json` ({"weight_map": name ->
// file}) beside its files; every file must exist and every name be in exactly the file the map
// names. Tests: tests/safetensors_test.cpp; fuzz/safetensors_fuzz.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace pipetrain::models {

/// A safetensors file or sharded checkpoint that is malformed or cannot be read or written;
/// one line naming the file and, where there is one, the tensor.
class SafetensorsError : public DataError {
 public:
  using DataError::DataError;
};

/// Tensors in order, by name (the order a checkpoint writes them in).
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

/// The largest header the reader accepts (the reference implementation's limit).
constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

/// One tensor of a header: where its bytes lie, relative to the start of the data.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;        // as the file spells it: "F32", "BF16", ...
  at::ScalarType type;      // libtorch's type of the same bytes
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

/// A checked header: the entries in the order of their bytes, the metadata, and where the data starts.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + the header's length
  std::map<std::string, size_t> by_name;  // name -> index into entries (parse_safetensors fills it)
  /// The entry named `name`, or null.
  const SafetensorsEntry* find(const std::string& name) const;
};

/// Parses and checks the header of a whole file of `size` bytes at `bytes`; `file` names it in
/// errors. Checks every entry against `size` (nothing is read past it) and BOOL bytes.
SafetensorsHeader parse_safetensors(const char* bytes, uint64_t size, const std::string& file);

/// Parses JSON text as the safetensors header and index are read: a key twice in one object,
/// nesting deeper than 8 levels or malformed text (UTF-8 included) is a SafetensorsError
/// naming `source`.
nlohmann::json parse_unique_json(const std::string& text, const std::string& source);

/// libtorch's type for a safetensors dtype name (F64, F32, F16, BF16, I64, I32, I16, I8, U8,
/// BOOL, U16, U32, U64, F8_E4M3, F8_E5M2, F8_E8M0, C64); false for a name not in that table (the
/// sub-byte F4 and F6 types among them).
bool safetensors_type(const std::string& dtype, at::ScalarType* type);
/// The safetensors name of a libtorch type; SafetensorsError naming `what` for one it cannot hold.
std::string safetensors_dtype(at::ScalarType type, const std::string& what);

/// One file, memory-mapped (private, copy-on-write: writing to a returned tensor never changes
/// the file) and checked whole when opened. The mapping lives while any tensor from it does.
class SafetensorsFile {
 public:
  /// Maps and checks `path`; SafetensorsError naming it on any problem.
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  /// The names, in the order of their bytes.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return header_.find(name) != nullptr; }
  /// The tensor `name`: a view of the mapped bytes (no copy) when they are aligned for its type,
  /// which every file written by this writer or by Python's safetensors is; otherwise a copy.
  /// SafetensorsError naming the file when there is no such tensor.
  at::Tensor get(const std::string& name) const;
  /// Whether get(name) is a view of the mapping (for tests).
  bool is_view(const std::string& name) const;
  /// Every tensor, in the order of their bytes.
  NamedTensors all() const;

 private:
  std::string path_;
  std::shared_ptr<void> mapping_;  // unmapped when the last tensor viewing it goes
  const char* base_ = nullptr;
  SafetensorsHeader header_;
};

/// The bytes of a safetensors file holding `tensors` (any device, layout or stride: copied to
/// contiguous CPU memory) and `metadata`. The header is padded with spaces to a multiple of 8 and
/// the tensors ordered by item size, largest first (then as given), so that every tensor is
/// aligned for its type. SafetensorsError naming `file` and the tensor for a duplicate or
/// reserved name or a type safetensors cannot hold.
std::string safetensors_bytes(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata,
                              const std::string& file);

/// Writes one file atomically (common/atomic_file.h): the old file or the new, never half.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// The index of a sharded checkpoint, as Hugging Face names it.
constexpr const char* kSafetensorsIndex = "model.safetensors.index.json";
/// The single file of an unsharded checkpoint.
constexpr const char* kSafetensorsSingle = "model.safetensors";

/// A checkpoint folder (or one .safetensors file, or an index file): `model.safetensors`, or
/// `model.safetensors.index.json` and the files its weight_map names. Every file is opened and
/// checked, and the map against them: each file exists and is a plain name in the folder, each
/// name is in exactly one file, the file the map gives.
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::string& path);
  /// Every name, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) > 0; }
  /// The tensor `name` (SafetensorsFile::get); SafetensorsError naming the checkpoint if absent.
  at::Tensor get(const std::string& name) const;
  /// The file that holds `name`.
  const std::string& file_of(const std::string& name) const;
  /// The files, in the order read (one for an unsharded checkpoint).
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::string path_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

/// Writes `tensors` into the folder `dir` (created if absent): `model.safetensors` when their
/// bytes fit in `max_shard_bytes`, else shards `model-0000i-of-0000n.safetensors` of at most
/// that many bytes each (a larger tensor alone in its shard), in order, and the index (with
/// metadata.total_size, the tensors' bytes; `metadata` goes into every shard). Each file is written
/// atomically; the index last.
/// Returns the files written, by name.
std::vector<std::string> save_safetensors_checkpoint(const std::string& dir, const NamedTensors& tensors,
                                                     uint64_t max_shard_bytes,
                                                     const std::map<std::string, std::string>& metadata = {});

}  // namespace pipetrain::models
