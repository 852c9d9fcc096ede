// What the layer-list tests share: a model built from a JSON model section, and the one-line
// error a section that cannot be built gives.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/json_reader.h"
#include "models/model.h"

namespace pipetrain::test {

inline models::Model build_model_section(const nlohmann::json& cfg, uint64_t seed = 3) {
  JsonReader r(cfg, "model", "test.json");
  return models::build(r, seed);
}

inline std::string build_error(const nlohmann::json& cfg) {
  try {
    build_model_section(cfg);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(built)";
}

}  // namespace pipetrain::test
