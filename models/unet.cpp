// unet: a small U-Net for per-pixel classification of square grey images (a segmentation of
// Fashion-MNIST: each pixel is the item's class + 1 where the item is, 0 elsewhere).
//   enc1  conv (C)                    stashes "enc1"     full size
//   enc2  pool, conv (2C)             stashes "enc2"     1/2
//   mid   pool, conv (4C), dropout                       1/4
//   dec2  up, conv (2C), concat "enc2", conv (2C)        1/2
//   dec1  up, conv (C), concat "enc1", conv (C)          full size
//   head  1x1 conv to the classes, channels last: [N, H, W, classes]
// The skips cross stage boundaries when the stages cut between them (models/skip.h): on three
// stages of two layers, "enc1" crosses two boundaries and "enc2" one. Spelled as a layer list
// (models/layer_table.h), each named layer one sequential.
#include <nlohmann/json.hpp>

#include "models/families.h"
#include "models/layer_table.h"

namespace pipetrain::models {

namespace {

using nlohmann::json;

// Conv 3x3 (same padding) + ReLU, its parameters under `module` ("<layer>.<module>.conv.weight").
json conv_relu(const std::string& module, int64_t in, int64_t out) {
  return {{"type", "sequential"},
          {"module", module},
          {"layers", {{{"type", "conv2d"}, {"in_channels", in}, {"out_channels", out}, {"kernel_size", 3}, {"padding", 1}}, {{"type", "relu"}}}}};
}

// Optional 2x2 max-pool, conv + ReLU, dropout; stashes its output under `stash` (if not empty).
json down(const std::string& name, int64_t in, int64_t out, bool pool, const std::string& stash, double dropout) {
  json ops = json::array();
  if (pool) ops.push_back({{"type", "maxpool2d"}, {"kernel_size", 2}});
  ops.push_back(conv_relu("conv", in, out));
  if (dropout > 0) ops.push_back({{"type", "dropout"}, {"p", dropout}});
  json layer = {{"name", name}, {"type", "sequential"}, {"layers", ops}};
  if (!stash.empty()) layer["stash"] = stash;
  return layer;
}

// 2x nearest upsampling, conv + ReLU to `out` channels, concatenation with the skip `from`
// (`out` channels), conv + ReLU back to `out`.
json up(const std::string& name, int64_t in, int64_t out, const std::string& from) {
  return {{"name", name},
          {"type", "sequential"},
          {"layers", {{{"type", "upsample"}, {"scale_factor", 2}}, conv_relu("up", in, out), {{"type", "concat"}, {"from", from}, {"dim", 1}},
                      conv_relu("merge", 2 * out, out)}}};
}

}  // namespace

Model build_unet(JsonReader& r) {
  const int64_t in_channels = r.get_int("in_channels", 1, 1, 64);
  const int64_t image = r.get_int("image_size", 28, 4, 4096);
  const int64_t c = r.get_int("channels", 16, 1, 4096);
  const int64_t classes = r.get_int("classes", 11, 2, 1 << 16);
  const double dropout = r.get_number("dropout", 0.0, 0.0, 0.99);
  if (image % 4 != 0) r.fail("image_size", "must be divisible by 4 (two 2x2 pools)");
  // The 1x1 conv to the classes, channels moved last so that the loss sees [..., classes].
  const json head = {{"name", "head"},
                     {"type", "sequential"},
                     {"layers", {{{"type", "conv2d"}, {"in_channels", c}, {"out_channels", classes}, {"kernel_size", 1}},
                                 {{"type", "permute"}, {"dims", {0, 2, 3, 1}}}}}};
  const json list = {down("enc1", in_channels, c, false, "enc1", 0.0), down("enc2", c, 2 * c, true, "enc2", 0.0),
                     down("mid", 2 * c, 4 * c, true, "", dropout),   up("dec2", 4 * c, 2 * c, "enc2"),
                     up("dec1", 2 * c, c, "enc1"),                   head};
  Model m = build_spelled_list({{"input_shape", {in_channels, image, image}}, {"layers", list}}, "the unet preset");
  m.pixel_targets = true;
  return m;
}

}  // namespace pipetrain::models
