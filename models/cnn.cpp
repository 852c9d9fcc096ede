// cnn: a small convolutional classifier for 28x28 grey images (Fashion-MNIST):
// conv1 (conv+pool) -> conv2 (conv+pool) -> conv3 -> fc (dropout) -> head. With `batch_norm`,
// each conv is followed by a BatchNorm (running statistics deferred to the end of the step).
#include <torch/torch.h>

#include "models/families.h"
#include "models/layers.h"

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
  Model m;
  m.layers = torch::nn::Sequential();
  m.layers->push_back("conv1", ConvBlock(in_channels, c, /*pool=*/true, batch_norm));
  m.layers->push_back("conv2", ConvBlock(c, 2 * c, /*pool=*/true, batch_norm));
  m.layers->push_back("conv3", ConvBlock(2 * c, 2 * c, /*pool=*/false, batch_norm));
  const int64_t side = image / 4;
  m.layers->push_back("fc", Dense(2 * c * side * side, hidden, /*relu=*/true, dropout, 0));
  m.layers->push_back("head", Dense(hidden, classes, /*relu=*/false));
  m.sample_shape = {in_channels, image, image};
  m.classes = classes;
  return m;
}

}  // namespace pipetrain::models
