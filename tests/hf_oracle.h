// Shared by the suites that check the hf family (hf_test, hf_family_test, generate_hf_test): a
// scratch directory, the project's Python and tests/hf_models.py, which makes tiny transformers
// models and says what transformers computes with them, and the family's model of a directory.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/json_reader.h"
#include "models/families.h"
#include "models/hf.h"
#include "models/model.h"
#include "tests/process_helpers.h"

namespace pipetrain::test {

/// TempDir()/pipetrain_<name>_<pid>, made if need be; emptied the first time a process asks for
/// it, since an earlier process of the same pid may have left one (a model written over another's
/// files reads both).
inline std::string scratch_dir(const std::string& name) {
  const std::string p = ::testing::TempDir() + "/pipetrain_" + name + "_" + std::to_string(::getpid());
  static std::mutex m;
  static std::set<std::string> fresh;
  std::lock_guard<std::mutex> lock(m);
  if (fresh.insert(p).second) std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

inline std::string python() { return PIPETRAIN_PYTHON; }
/// Under ctest its commands go to a server with transformers imported once (PIPETRAIN_HF_ORACLE,
/// the fixture `hf_oracle` of tests/CMakeLists.txt); run by hand, each starts its own Python.
inline std::string hf_oracle() { return std::string(PIPETRAIN_SOURCE_DIR) + "/tests/hf_models.py"; }
/// Whether the project's Python has transformers (scripts/setup.sh installs it); without it the
/// cases that need it are skipped. Found, not imported: an import takes seconds, and a broken one
/// fails the oracle's command loudly.
inline bool has_transformers() {
  return shell(python() + " -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec(\"transformers\") is None)' >/dev/null 2>&1").status == 0;
}

/// The `hf` family's model of the directory `dir` for windows of `seq_len` tokens, `extra`'s keys added.
inline models::Model hf_build(const std::string& dir, int64_t seq_len, const nlohmann::json& extra = nlohmann::json::object()) {
  nlohmann::json j{{"family", "hf"}, {"path", dir}, {"seq_len", seq_len}};
  j.update(extra);
  JsonReader r(j, "model", "test");
  return models::build(r, 0);
}

/// The one-line error of the `hf` model section of `dir` (with `extra`'s keys), or "(built)".
inline std::string hf_error(const std::string& dir, int64_t seq_len = 8, const nlohmann::json& extra = nlohmann::json::object()) {
  try {
    hf_build(dir, seq_len, extra);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(built)";
}

/// `config` (config.json, by hand) and random weights named as transformers names them, written
/// into `dir` (made) in save_pretrained's form; returns dir.
inline std::string hf_write_model(const std::string& dir, const nlohmann::json& config, int64_t seq_len = 8) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config.dump(2);
  const models::HfSpec spec = models::read_hf_spec(dir, seq_len, "test");
  JsonReader list(spec.layers, "model", "test");
  const models::Model m = models::build_layer_list(list);
  std::map<std::string, at::Tensor> weights;
  for (const auto& p : m.layers->named_parameters()) weights[p.key()] = p.value();
  for (const auto& b : m.layers->named_buffers()) weights[b.key()] = b.value();
  models::save_hf(dir, weights, dir, uint64_t{1} << 30);
  return dir;
}

/// `config` with `changes`' keys set over it (a config.json edited).
inline nlohmann::json with(nlohmann::json config, const nlohmann::json& changes) {
  for (auto& [k, v] : changes.items()) config[k] = v;
  return config;
}

}  // namespace pipetrain::test
