// What the layer-list tests share: a model built from a JSON model section, the one-line error a
// section that cannot be built gives, a list holding one llama_block, and checks of a token
// mixer in that block (its values counted, causality, generation's steps).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/error.h"
#include "common/json_reader.h"
#include "models/generate.h"
#include "models/incremental.h"
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

/// The values of the parameters of llama_list's block "b" in `m`.
inline int64_t block_values(const models::Model& m) {
  int64_t values = 0;
  for (const auto& p : m.layers->named_parameters()) values += p.key().rfind("b.", 0) == 0 ? p.value().numel() : 0;
  return values;
}

/// `m` (llama_list's, in eval) over ids [2, 6]: a position's output does not depend on the later
/// positions (causal), and positions from `mixed_from` on depend on the first (a token mixer).
inline void expect_causal_mixer(models::Model& m, const at::Tensor& ids, int64_t mixed_from) {
  torch::NoGradGuard no_grad;
  const int64_t T = ids.size(1);
  at::Tensor later = ids.clone(), earlier = ids.clone();
  later.index_put_({torch::indexing::Slice(), T - 1}, (ids.select(1, T - 1) + 1) % 20);
  earlier.index_put_({torch::indexing::Slice(), 0}, (ids.select(1, 0) + 1) % 20);
  const at::Tensor y = m.layers->forward(ids);
  EXPECT_TRUE(torch::equal(y.narrow(1, 0, T - 1), m.layers->forward(later).narrow(1, 0, T - 1)));  // causal
  EXPECT_GT((y.narrow(1, mixed_from, T - mixed_from) - m.layers->forward(earlier).narrow(1, mixed_from, T - mixed_from)).abs().max().item<double>(), 0);
}

/// The largest difference, in float64, between `m`'s outputs over `ids` and its outputs part by
/// part ({from, count}) through each layer's kept state (generation's steps).
inline double incremental_gap(models::Model& m, const at::Tensor& ids, const std::vector<std::pair<int64_t, int64_t>>& parts) {
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(models::generates_incrementally(m.layers));
  m.layers->to(torch::kDouble);
  const at::Tensor whole = m.layers->forward(ids);
  std::vector<models::KvCache> caches(m.layers->children().size());
  std::vector<at::Tensor> outs;
  for (const auto& [from, n] : parts) {
    at::Tensor x = ids.narrow(1, from, n);
    size_t i = 0;
    for (const auto& layer : m.layers->children()) x = dynamic_cast<models::IncrementalLayer*>(layer.get())->forward_at(x, from, caches[i++]);
    outs.push_back(x);
  }
  return (torch::cat(outs, 1) - whole).abs().max().item<double>();
}

}  // namespace pipetrain::test
