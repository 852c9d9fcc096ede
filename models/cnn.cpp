// cnn: a small convolutional classifier for 28x28 grey images (Fashion-MNIST):
// conv1 (conv+pool) -> conv2 (conv+pool) -> conv3 -> fc (dropout) -> head. With `batch_norm`,
// each conv is followed by a BatchNorm (running statistics deferred to the end of the step).
// Spelled as a layer list (models/layer_table.h), each named layer one sequential.
#include <nlohmann/json.hpp>

#include "models/families.h"
#include "models/layer_table.h"

namespace pipetrain::models {

Model build_cnn(JsonReader& r) {
  const int64_t in_channels = r.get_int("in_channels", 1, 1, 64);
  const int64_t image = r.get_int("image_size", 28, 4, 4096);
  const int64_t c = r.get_int("channels", 32, 1, 4096);
  const int64_t hidden = r.get_int("hidden", 128, 1, 1 << 20);
  const int64_t classes = r.get_int("classes", 10, 1, 1 << 20);
  const double dropout = r.get_number("dropout", 0.25, 0.0, 0.99);
  const bool batch_norm = r.get_bool("batch_norm", false);
  if (image % 4 != 0) r.fail("image_size", "must be divisible by 4 (two 2x2 pools)");
  using nlohmann::json;
  // Conv 3x3 (same padding; no bias before a BatchNorm, whose mean cancels it), ReLU, 2x2 pool.
  auto conv = [&](const std::string& name, int64_t in, int64_t out, bool pool) {
    json ops = {{{"type", "conv2d"}, {"in_channels", in}, {"out_channels", out}, {"kernel_size", 3}, {"padding", 1}, {"bias", !batch_norm}}};
    if (batch_norm) ops.push_back({{"type", "batchnorm2d"}, {"num_features", out}});
    ops.push_back({{"type", "relu"}});
    if (pool) ops.push_back({{"type", "maxpool2d"}, {"kernel_size", 2}});
    return json{{"name", name}, {"type", "sequential"}, {"layers", ops}};
  };
  const int64_t side = image / 4;
  json fc = {{{"type", "flatten"}}, {{"type", "linear"}, {"in_features", 2 * c * side * side}, {"out_features", hidden}}, {{"type", "relu"}}};
  if (dropout > 0) fc.push_back({{"type", "dropout"}, {"p", dropout}});
  const json list = {conv("conv1", in_channels, c, true), conv("conv2", c, 2 * c, true), conv("conv3", 2 * c, 2 * c, false),
                     {{"name", "fc"}, {"type", "sequential"}, {"layers", fc}},
                     {{"name", "head"}, {"type", "linear"}, {"in_features", hidden}, {"out_features", classes}}};
  return build_spelled_list({{"input_shape", {in_channels, image, image}}, {"layers", list}}, "the cnn preset");
}

}  // namespace pipetrain::models
