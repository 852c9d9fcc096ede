// Sharded safetensors checkpoints: model.safetensors.index.json and the files its weight_map
// names, read and checked against each other, and written (models/safetensors.h).
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/json_reader.h"
#include "common/strings.h"
#include "models/safetensors.h"

namespace pipetrain::models {

namespace {

constexpr uint64_t kMaxIndex = 256 << 20;  // an index of millions of names is still far below

std::string in_quotes(const std::string& name) { return "'" + printable(name, 120) + "'"; }

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw SafetensorsError(printable(file, 300) + ": " + what);
}

bool regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string read_index(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, std::string("cannot open (") + std::strerror(errno) + ")");
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  if (static_cast<uint64_t>(st.st_size) > kMaxIndex) fail(path, "an index of " + std::to_string(st.st_size) + " bytes (at most 256 MiB are read)");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (!in || !(text << in.rdbuf())) fail(path, "cannot read");
  return text.str();
}

// A file name of the weight_map: a plain name in the index's folder, never a path out of it.
bool plain_name(const std::string& f) {
  return !f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos && f.find('\0') == std::string::npos;
}

}  // namespace

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& path) : path_(path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string index;
  if (fs::is_directory(path, ec)) {
    if (regular_file(path + "/" + kSafetensorsIndex)) {
      index = path + "/" + kSafetensorsIndex;
    } else if (regular_file(path + "/" + kSafetensorsSingle)) {
      files_.push_back(std::make_shared<SafetensorsFile>(path + "/" + kSafetensorsSingle));
    } else {
      fail(path, std::string("neither ") + kSafetensorsIndex + " nor " + kSafetensorsSingle + " is in this folder");
    }
  } else if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    index = path;
  } else {
    files_.push_back(std::make_shared<SafetensorsFile>(path));
  }
  if (!index.empty()) {
    const nlohmann::json j = parse_unique_json(read_index(index), index);
    if (!j.is_object()) fail(index, "not a JSON object");
    const auto map = j.find("weight_map");
    if (map == j.end() || !map->is_object()) fail(index, "no weight_map (an object: tensor name -> file)");
    if (map->empty()) fail(index, "an empty weight_map");
    const auto meta = j.find("metadata");
    if (meta != j.end() && !meta->is_object()) fail(index, "metadata is " + describe(*meta) + ", not an object");
    const std::string dir = fs::path(index).parent_path().string();
    std::map<std::string, std::set<std::string>> names_of;  // file -> the names the map puts there
    for (const auto& [name, file] : map->items()) {
      if (!file.is_string()) fail(index, "weight_map " + in_quotes(name) + " is " + describe(file) + ", not a file name");
      const std::string f = file.get<std::string>();
      if (!plain_name(f)) fail(index, "weight_map " + in_quotes(name) + " names " + in_quotes(f) + ", not a file in the index's folder");
      names_of[f].insert(name);
    }
    for (const auto& [f, names] : names_of) {
      const std::string full = (dir.empty() ? f : dir + "/" + f);
      if (!regular_file(full)) fail(index, "weight_map names " + in_quotes(f) + " (for tensor " + in_quotes(*names.begin()) + "), which is not in " + printable(dir.empty() ? "." : dir, 200));
      auto file = std::make_shared<SafetensorsFile>(full);
      for (const auto& e : file->header().entries)
        if (!names.count(e.name)) {
          const auto other = map->find(e.name);
          fail(full, "tensor " + in_quotes(e.name) + (other == map->end() ? std::string(" is not in the weight_map of ") + index
                                                                  : " is mapped to " + in_quotes(other->get<std::string>()) + " by " + index));
        }
      for (const auto& name : names)
        if (!file->contains(name)) fail(index, "weight_map puts tensor " + in_quotes(name) + " in " + in_quotes(f) + ", which does not hold it");
      files_.push_back(std::move(file));
    }
  }
  for (const auto& file : files_)
    for (const auto& e : file->header().entries) where_[e.name] = file.get();
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : where_) out.push_back(name);
  return out;
}

at::Tensor SafetensorsCheckpoint::get(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) fail(path_, "no tensor " + in_quotes(name));
  return it->second->get(name);
}

const std::string& SafetensorsCheckpoint::file_of(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) fail(path_, "no tensor " + in_quotes(name));
  return it->second->path();
}

std::vector<std::string> save_safetensors_checkpoint(const std::string& dir, const NamedTensors& tensors,
                                                     uint64_t max_shard_bytes,
                                                     const std::map<std::string, std::string>& metadata) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(dir, "cannot create the folder (" + ec.message() + ")");
  if (max_shard_bytes == 0) fail(dir, "a shard size of 0 bytes");
  // Shards in order: a tensor goes to the current shard unless it would pass the limit there.
  std::vector<NamedTensors> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const auto& entry : tensors) {
    const uint64_t bytes = entry.second.defined() ? static_cast<uint64_t>(entry.second.numel()) * entry.second.element_size() : 0;
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(entry);
    in_shard += bytes;
    total += bytes;
  }
  // Whichever form is written, the other one's entry file goes, so that a reader finds this one.
  const std::string single = dir + "/" + kSafetensorsSingle, index = dir + "/" + kSafetensorsIndex;
  if (shards.size() == 1) {
    save_safetensors(single, tensors, metadata);
    std::remove(index.c_str());
    return {kSafetensorsSingle};
  }
  std::vector<std::string> written;
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  const size_t n = shards.size();
  for (size_t i = 0; i < n; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
    save_safetensors(dir + "/" + name, shards[i], metadata);
    for (const auto& [tensor, t] : shards[i]) map[tensor] = name;
    written.emplace_back(name);
  }
  const nlohmann::ordered_json j = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
  write_file_atomically(index, j.dump(2) + "\n");
  std::remove(single.c_str());
  written.emplace_back(kSafetensorsIndex);
  return written;
}

}  // namespace pipetrain::models
