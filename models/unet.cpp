// unet: a small U-Net for per-pixel classification of square grey images (a segmentation of
// Fashion-MNIST: each pixel is the item's class + 1 where the item is, 0 elsewhere).
//   enc1  conv (C)                    stashes "enc1"     full size
//   enc2  pool, conv (2C)             stashes "enc2"     1/2
//   mid   pool, conv (4C), dropout                       1/4
//   dec2  up, conv (2C), concat "enc2", conv (2C)        1/2
//   dec1  up, conv (C), concat "enc1", conv (C)          full size
//   head  1x1 conv to the classes, channels last: [N, H, W, classes]
// The skips cross stage boundaries when the stages cut between them (models/skip.h): on three
// stages of two layers, "enc1" crosses two boundaries and "enc2" one.
#include <torch/torch.h>

#include "models/families.h"
#include "models/layers.h"
#include "models/max_pool.h"
#include "models/skip.h"

namespace pipetrain::models {

namespace {

// Optional 2x2 max-pool, then conv 3x3 + ReLU, then dropout; stashes its output under `stash`
// (if not empty).
class DownImpl : public torch::nn::Cloneable<DownImpl>, public SkipDeclaring {
 public:
  DownImpl(int64_t in, int64_t out, bool pool, std::string stash, double dropout = 0.0, uint64_t stream = 0)
      : in_(in), out_(out), pool_(pool), stash_(std::move(stash)), dropout_p_(dropout), stream_(stream) {
    reset();
  }
  void reset() override {
    conv_ = register_module("conv", ConvBlock(in_, out_, /*pool=*/false));
    dropout_ = register_module("dropout", Dropout(dropout_p_, stream_));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = dropout_(conv_(pool_ ? max_pool2x2(x) : x));
    if (!stash_.empty()) models::stash(stash_, h);
    return h;
  }
  std::vector<std::string> stashes() const override { return stash_.empty() ? std::vector<std::string>{} : std::vector<std::string>{stash_}; }

 private:
  int64_t in_, out_;
  bool pool_;
  std::string stash_;
  double dropout_p_;
  uint64_t stream_;
  ConvBlock conv_{nullptr};
  Dropout dropout_{nullptr};
};
TORCH_MODULE(Down);

// 2x nearest upsampling, conv 3x3 + ReLU to `out` channels, concatenation with the skip popped
// from `pop` (`out` channels), conv 3x3 + ReLU back to `out`.
class UpImpl : public torch::nn::Cloneable<UpImpl>, public SkipDeclaring {
 public:
  UpImpl(int64_t in, int64_t out, std::string pop) : in_(in), out_(out), pop_(std::move(pop)) { reset(); }
  void reset() override {
    up_ = register_module("up", ConvBlock(in_, out_, /*pool=*/false));
    merge_ = register_module("merge", ConvBlock(2 * out_, out_, /*pool=*/false));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = up_(torch::upsample_nearest2d(x, {x.size(2) * 2, x.size(3) * 2}));
    return merge_(torch::cat({h, models::pop(pop_)}, 1));
  }
  std::vector<std::string> pops() const override { return {pop_}; }

 private:
  int64_t in_, out_;
  std::string pop_;
  ConvBlock up_{nullptr}, merge_{nullptr};
};
TORCH_MODULE(Up);

// 1x1 conv to the classes, channels moved last so that the loss sees [..., classes].
class PixelHeadImpl : public torch::nn::Cloneable<PixelHeadImpl> {
 public:
  PixelHeadImpl(int64_t in, int64_t classes) : in_(in), classes_(classes) { reset(); }
  void reset() override { conv_ = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_, classes_, 1))); }
  at::Tensor forward(const at::Tensor& x) { return conv_(x).permute({0, 2, 3, 1}); }

 private:
  int64_t in_, classes_;
  torch::nn::Conv2d conv_{nullptr};
};
TORCH_MODULE(PixelHead);

}  // namespace

Model build_unet(JsonReader& r) {
  const int64_t in_channels = r.get_int("in_channels", 1, 1, 64);
  const int64_t image = r.get_int("image_size", 28, 4, 4096);
  const int64_t c = r.get_int("channels", 16, 1, 4096);
  const int64_t classes = r.get_int("classes", 11, 2, 1 << 16);
  const double dropout = r.get_number("dropout", 0.0, 0.0, 0.99);
  if (image % 4 != 0) r.fail("image_size", "must be divisible by 4 (two 2x2 pools)");
  Model m;
  m.layers = torch::nn::Sequential();
  m.layers->push_back("enc1", Down(in_channels, c, /*pool=*/false, "enc1"));
  m.layers->push_back("enc2", Down(c, 2 * c, /*pool=*/true, "enc2"));
  m.layers->push_back("mid", Down(2 * c, 4 * c, /*pool=*/true, "", dropout, 0));
  m.layers->push_back("dec2", Up(4 * c, 2 * c, "enc2"));
  m.layers->push_back("dec1", Up(2 * c, c, "enc1"));
  m.layers->push_back("head", PixelHead(c, classes));
  m.sample_shape = {in_channels, image, image};
  m.classes = classes;
  m.pixel_targets = true;
  return m;
}

}  // namespace pipetrain::models
