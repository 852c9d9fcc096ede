// gpt: decoder-only transformer: embed (token + position), block0..N-1, norm, head. With
// `tie_embeddings`, the head's weight is tied to the token embedding (models::Tie). Spelled as a
// layer list (models/layer_table.h); the embedding's and blocks' parameters are named under the
// layer itself ("embed.tok.weight", "block0.qkv.weight").
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "models/families.h"
#include "models/layer_table.h"

namespace pipetrain::models {

Model build_gpt(JsonReader& r) {
  const int64_t vocab = r.get_int("vocab_size", 256, 2, 1 << 24);
  const int64_t seq_len = r.get_int("seq_len", 64, 1, 1 << 20);
  const int64_t d_model = r.get_int("d_model", 128, 1, 1 << 16);
  const int64_t n_heads = r.get_int("n_heads", 4, 1, 1024);
  const int64_t n_layers = r.get_int("n_layers", 4, 1, 4096);
  const int64_t d_ff = r.get_int("d_ff", 4 * d_model, 1, 1 << 20);
  const double dropout = r.get_number("dropout", 0.1, 0.0, 0.99);
  const bool tie = r.get_bool("tie_embeddings", false);
  if (d_model % n_heads != 0)
    r.fail("n_heads", "must divide model.d_model (" + std::to_string(d_model) + ")");
  using nlohmann::json;
  json list = {{{"name", "embed"}, {"type", "embedding"}, {"num_embeddings", vocab}, {"embedding_dim", d_model},
                {"max_positions", seq_len}, {"dropout", dropout}, {"module", ""}}};
  for (int64_t i = 0; i < n_layers; ++i)
    list.push_back({{"name", "block" + std::to_string(i)}, {"type", "transformer_block"}, {"d_model", d_model}, {"n_heads", n_heads},
                    {"d_ff", d_ff}, {"dropout", dropout}, {"module", ""}});
  list.push_back({{"name", "norm"}, {"type", "layernorm"}, {"normalized_shape", d_model}});
  list.push_back({{"name", "head"}, {"type", "linear"}, {"in_features", d_model}, {"out_features", vocab}});
  json spelled = {{"input_shape", {seq_len}}, {"input_dtype", "long"}, {"layers", list}};
  // The head's weight starts as the token embedding and stays tied to it.
  if (!tie) return build_spelled_list(spelled, "the gpt preset");
  spelled["ties"] = json::array({json::array({"embed.tok.weight", "head.linear.weight"})});
  Model m = build_spelled_list(spelled, "the gpt preset");
  // An embedding's own initialization (unit normal) as the head's weight would give logits of
  // standard deviation sqrt(d_model) at the start (a loss several times ln(vocab_size)): the tied
  // weight starts at GPT-2's scale instead, a normal of standard deviation 0.02 (scaled, so that
  // the random numbers drawn for every other parameter stay as they were).
  torch::NoGradGuard no_grad;
  auto params = m.layers->named_parameters();
  params["embed.tok.weight"].mul_(kTiedEmbeddingStd);
  params["head.linear.weight"].copy_(params["embed.tok.weight"]);
  return m;
}

}  // namespace pipetrain::models
