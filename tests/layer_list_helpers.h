// What the layer-list tests share: a model built from a JSON model section, the one-line error a
// section that cannot be built gives, and a list holding one llama_block.
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

/// A layer list of an embedding (20 tokens of 16) and a llama_block "b" of `base`'s arguments
/// with `extra`'s over them.
inline nlohmann::json llama_list(const nlohmann::json& extra,
                                 const nlohmann::json& base = nlohmann::json{{"d_model", 16}, {"n_heads", 4}, {"d_ff", 24}}) {
  nlohmann::json b{{"name", "b"}, {"type", "llama_block"}};
  for (const auto& [k, v] : base.items()) b[k] = v;
  for (const auto& [k, v] : extra.items()) b[k] = v;
  return nlohmann::json{{"family", "layers"}, {"input_shape", {6}}, {"input_dtype", "long"},
                        {"layers", nlohmann::json::array({nlohmann::json{{"name", "e"}, {"type", "embedding"}, {"num_embeddings", 20}, {"embedding_dim", 16}}, b})}};
}

}  // namespace pipetrain::test
