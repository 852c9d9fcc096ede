// gpt: decoder-only transformer: embed (token + position), block0..N-1, norm, head. With
// `tie_embeddings`, the head's weight is tied to the token embedding (models::Tie).
#include <torch/torch.h>

#include "models/families.h"
#include "models/layers.h"

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
  Model m;
  m.layers = torch::nn::Sequential();
  m.layers->push_back("embed", Embedding(vocab, seq_len, d_model, dropout, 0));
  for (int64_t i = 0; i < n_layers; ++i)
    m.layers->push_back("block" + std::to_string(i),
                        Block(d_model, n_heads, d_ff, dropout, 1 + 3 * static_cast<uint64_t>(i)));
  m.layers->push_back("norm", Norm(d_model));
  m.layers->push_back("head", Dense(d_model, vocab, /*relu=*/false, 0.0, 0, /*flatten=*/false));
  if (tie) {  // the head's weight starts as the token embedding and stays tied to it
    const int head = static_cast<int>(m.layers->size()) - 1;
    torch::NoGradGuard no_grad;
    m.layers->ptr(head)->named_parameters()["linear.weight"].copy_(m.layers->ptr(0)->named_parameters()["tok.weight"]);
    m.ties.push_back({{0, "tok.weight"}, {head, "linear.weight"}});
  }
  m.sample_shape = {seq_len};
  m.token_input = true;
  m.classes = vocab;
  return m;
}

}  // namespace pipetrain::models
