// mlp: `layers` hidden blocks Linear+ReLU (fc1..fcN), then a linear `head`.
#include <torch/torch.h>

#include "models/families.h"
#include "models/layers.h"

namespace pipetrain::models {

Model build_mlp(JsonReader& r) {
  const int64_t in = r.get_int("in", 784, 1, 1 << 24);
  const int64_t width = r.get_int("width", 256, 1, 1 << 20);
  const int64_t layers = r.get_int("layers", 4, 1, 4096);
  const int64_t out = r.get_int("out", 10, 1, 1 << 24);
  const double dropout = r.get_number("dropout", 0.0, 0.0, 0.99);
  Model m;
  m.layers = torch::nn::Sequential();
  for (int64_t i = 0; i < layers; ++i)
    m.layers->push_back("fc" + std::to_string(i + 1),
                        Dense(i == 0 ? in : width, width, /*relu=*/true, dropout, i));
  m.layers->push_back("head", Dense(width, out, /*relu=*/false));
  m.sample_shape = {in};
  m.classes = out;
  return m;
}

}  // namespace pipetrain::models
