// mlp: `layers` hidden layers fc1..fcN (linear, relu, dropout as one layer), then a linear
// `head`; spelled as a layer list (models/layer_table.h).
#include <nlohmann/json.hpp>

#include "models/families.h"
#include "models/layer_table.h"

namespace pipetrain::models {

Model build_mlp(JsonReader& r) {
  const int64_t in = r.get_int("in", 784, 1, 1 << 24);
  const int64_t width = r.get_int("width", 256, 1, 1 << 20);
  const int64_t layers = r.get_int("layers", 4, 1, 4096);
  const int64_t out = r.get_int("out", 10, 1, 1 << 24);
  const double dropout = r.get_number("dropout", 0.0, 0.0, 0.99);
  using nlohmann::json;
  json list = json::array();
  for (int64_t i = 0; i < layers; ++i) {
    json ops = {{{"type", "linear"}, {"in_features", i == 0 ? in : width}, {"out_features", width}}, {{"type", "relu"}}};
    if (dropout > 0) ops.push_back({{"type", "dropout"}, {"p", dropout}});
    list.push_back({{"name", "fc" + std::to_string(i + 1)}, {"type", "sequential"}, {"layers", ops}});
  }
  list.push_back({{"name", "head"}, {"type", "linear"}, {"in_features", width}, {"out_features", out}});
  return build_spelled_list({{"input_shape", {in}}, {"layers", list}}, "the mlp preset");
}

}  // namespace pipetrain::models
