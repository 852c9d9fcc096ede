#include "job/data.h"
#include "job/tensors_data.h"
#include "job/tokens_data.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include <torch/torch.h>

#include "common/error.h"

namespace pipetrain::job {

namespace {

constexpr double kFashionMean = 0.2860, kFashionStd = 0.3530;

bool file_exists(const std::string& f) {
  struct stat st;
  return ::stat(f.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string find_idx(const std::string& dir, const std::string& stem) {
  for (const char* ext : {".gz", ""}) {
    std::string f = dir + "/" + stem + ext;
    if (file_exists(f)) return f;
  }
  throw DataError("data.kind fashion-mnist: " + dir + "/" + stem +
                  ".gz not found (install the Debian package dataset-fashion-mnist, or point "
                  "data.path at a folder holding the IDX files)");
}

// errno is read before anything else can change it.
[[noreturn]] void throw_io_error(const std::string& file, const char* what) {
  const std::string reason = std::strerror(errno);
  throw DataError(file + ": " + what + " (" + reason + ")");
}

uint32_t be32(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

}  // namespace

at::Tensor read_idx(const std::string& file) {
  gzFile f = gzopen(file.c_str(), "rb");
  if (!f) throw DataError(file + ": cannot open");
  std::unique_ptr<gzFile_s, int (*)(gzFile)> guard(f, gzclose);
  auto read_exact = [&](void* buf, size_t n, const char* what) {
    size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
      int got = gzread(f, static_cast<char*>(buf) + done, chunk);
      if (got <= 0) {
        int err = 0;
        const char* msg = gzerror(f, &err);
        throw DataError(file + ": truncated or corrupt while reading " + what +
                        (err ? std::string(" (") + msg + ")" : ""));
      }
      done += static_cast<size_t>(got);
    }
  };
  unsigned char magic[4];
  read_exact(magic, 4, "the magic number");
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08)
    throw DataError(file + ": not an IDX file of unsigned bytes (bad magic number)");
  const int ndim = magic[3];
  if (ndim < 1 || ndim > 4) throw DataError(file + ": IDX file with " + std::to_string(ndim) + " dims");
  std::vector<int64_t> dims(ndim);
  uint64_t total = 1;
  for (int i = 0; i < ndim; ++i) {
    unsigned char b[4];
    read_exact(b, 4, "the dimensions");
    dims[i] = be32(b);
    total *= static_cast<uint64_t>(dims[i]);
    if (total > (uint64_t(1) << 34)) throw DataError(file + ": IDX dimensions too large");
  }
  auto t = torch::empty(dims, torch::kUInt8);
  read_exact(t.data_ptr<uint8_t>(), total, "the data");
  return t;
}

Batch Dataset::make(const Split& s, const at::Tensor& index) const {
  Batch b{s.inputs.index_select(0, index), s.targets.index_select(0, index)};
  if (b.target.scalar_type() == torch::kByte) b.target = b.target.to(torch::kLong);  // per-pixel targets, held as bytes
  if (images_u8) b.input = (b.input.to(torch::kFloat) / 255.0 - kFashionMean) / kFashionStd;
  if (widen_inputs) b.input = b.input.to(torch::kFloat);
  if (tokens && b.input.scalar_type() != torch::kLong) b.input = b.input.to(torch::kLong);
  if (tokens && b.target.scalar_type() != torch::kLong) b.target = b.target.to(torch::kLong);
  if (const int64_t mask = &s == &test ? test_token_mask : train_token_mask) {
    b.input.bitwise_and_(mask);
    b.target.bitwise_and_(mask);
  }
  return b;
}

int64_t Dataset::batches_per_epoch(int64_t batch_size, bool drop_last) const {
  return drop_last ? train.size() / batch_size : (train.size() + batch_size - 1) / batch_size;
}

int64_t Dataset::train_batch_size(int64_t step, int64_t batch_size, bool drop_last) const {
  const int64_t pos = step % batches_per_epoch(batch_size, drop_last);
  return std::min(batch_size, train.size() - pos * batch_size);
}

Batch Dataset::train_batch(int64_t step, int64_t batch_size, uint64_t seed, bool drop_last) const {
  const int64_t per_epoch = batches_per_epoch(batch_size, drop_last);
  const int64_t epoch = step / per_epoch, pos = step % per_epoch;
  if (epoch != order_epoch_) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ULL + static_cast<uint64_t>(epoch));
    order_ = torch::randperm(train.size(), gen, torch::kLong);
    order_epoch_ = epoch;
  }
  return make(train, order_.narrow(0, pos * batch_size, train_batch_size(step, batch_size, drop_last)));
}

int64_t Dataset::test_batches(int64_t batch_size) const {
  return (test.size() + batch_size - 1) / batch_size;
}

Batch Dataset::test_batch(int64_t index, int64_t batch_size) const {
  const int64_t start = index * batch_size, n = std::min(batch_size, test.size() - start);
  return make(test, torch::arange(start, start + n, torch::kLong));
}

at::Tensor read_bytes(const std::string& file) {
  struct stat st;
  if (::stat(file.c_str(), &st) != 0) throw_io_error(file, "cannot open");
  if (!S_ISREG(st.st_mode)) throw DataError(file + ": not a regular file");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(file.c_str(), "rb"), std::fclose);
  if (!f) throw_io_error(file, "cannot open");
  auto t = torch::empty({static_cast<int64_t>(st.st_size)}, torch::kUInt8);
  const size_t got = std::fread(t.data_ptr<uint8_t>(), 1, static_cast<size_t>(st.st_size), f.get());
  if (std::ferror(f.get())) throw_io_error(file, "read failed");
  return t.narrow(0, 0, static_cast<int64_t>(got));  // a file that shrank while being read
}

double unigram_loss(const at::Tensor& train_bytes, const at::Tensor& targets) {
  constexpr int64_t kBytes = 256;
  auto count = [](const at::Tensor& t) {
    return torch::bincount(t.reshape({-1}).to(torch::kLong), {}, kBytes).to(torch::kDouble);
  };
  const double n = static_cast<double>(train_bytes.numel());
  const auto log_p = ((count(train_bytes) + 1.0) / (n + kBytes)).log();
  if (targets.numel() == 0) return 0;
  return -(count(targets) * log_p).sum().item<double>() / static_cast<double>(targets.numel());
}

Dataset make_text(const at::Tensor& all, int64_t seq_len, double test_fraction, int64_t stride,
                  const std::string& file) {
  PIPETRAIN_CHECK(all.dim() == 1 && all.scalar_type() == torch::kByte, "bytes of ", file);
  PIPETRAIN_CHECK(seq_len >= 1 && stride >= 1 && test_fraction > 0 && test_fraction < 1);
  const at::Tensor bytes = all.contiguous();
  const int64_t n = bytes.numel(), window = seq_len + 1;
  const int64_t test_len = std::llround(static_cast<double>(n) * test_fraction), train_len = n - test_len;
  if (train_len < window || test_len < window)
    throw DataError(detail::concat(file, ": too short: its ", n, " bytes give ", train_len,
                                   " for training and ", test_len, " for testing (data.test_fraction ",
                                   test_fraction, ") but a window needs model.seq_len + 1 = ", window,
                                   " bytes in each"));
  // Windows are overlapping views of the file's bytes: row i starts at i * step.
  auto windows = [&](int64_t begin, int64_t len, int64_t step) {
    const int64_t rows = (len - window) / step + 1, offset = bytes.storage_offset() + begin;
    return Split{bytes.as_strided({rows, seq_len}, {step, 1}, offset),
                 bytes.as_strided({rows, seq_len}, {step, 1}, offset + 1)};
  };
  Dataset d;
  d.name = "text";
  d.sample_shape = {seq_len};
  d.classes = 256;
  d.tokens = true;
  d.train = windows(0, train_len, stride);
  d.test = windows(train_len, test_len, seq_len);
  d.baseline_name = "unigram";
  d.baseline_loss = unigram_loss(bytes.narrow(0, 0, train_len), d.test.targets);
  return d;
}

namespace {

Dataset load_text(const Config& c, const models::Model& model) {
  const std::string family = c.model.value("family", "");
  if (family != "gpt")
    throw ConfigError(c.where("model.family") +
                      ": data.kind text needs the gpt family (byte tokens), got \"" + family + "\"");
  if (model.classes != 256)
    throw ConfigError(c.where("model.vocab_size") +
                      ": data.kind text predicts bytes, so it must be 256, got " +
                      std::to_string(model.classes));
  const int64_t seq_len = model.sample_shape.at(0);
  return make_text(read_bytes(c.data.path), seq_len, c.data.test_fraction,
                   c.data.stride > 0 ? c.data.stride : seq_len, c.data.path);
}

Dataset load_fashion(const Config& c) {
  Dataset d;
  d.name = "fashion-mnist";
  d.sample_shape = {1, 28, 28};
  d.classes = 10;
  d.images_u8 = true;
  auto load = [&](const std::string& prefix) {
    Split s;
    const std::string fi = find_idx(c.data.path, prefix + "-images-idx3-ubyte");
    const std::string fl = find_idx(c.data.path, prefix + "-labels-idx1-ubyte");
    s.inputs = read_idx(fi);
    s.targets = read_idx(fl).to(torch::kLong);
    if (s.inputs.dim() != 3 || s.inputs.size(1) != 28 || s.inputs.size(2) != 28)
      throw DataError(fi + ": expected 28x28 images, got shape " + c10::str(s.inputs.sizes()));
    if (s.targets.dim() != 1 || s.targets.size(0) != s.inputs.size(0))
      throw DataError(fl + ": " + std::to_string(s.targets.numel()) + " labels for " +
                      std::to_string(s.inputs.size(0)) + " images");
    if (s.targets.numel() > 0 && s.targets.max().item<int64_t>() >= 10)
      throw DataError(fl + ": label out of range 0..9");
    s.inputs = s.inputs.unsqueeze(1);
    return s;
  };
  d.train = load("train");
  d.test = load("t10k");
  return d;
}

// Per-pixel targets of a segmentation: [N, H, W] uint8, the sample's label + 1 where `on`, else 0.
at::Tensor pixel_targets(const at::Tensor& on, const at::Tensor& labels) {
  const at::Tensor cls = (labels.to(torch::kLong) + 1).view({-1, 1, 1}).expand_as(on);
  return torch::where(on, cls, torch::zeros_like(cls)).to(torch::kUInt8).contiguous();
}

// A classification task with a hidden linear teacher: label = argmax(W x) over a fixed
// random projection, so it is learnable and deterministic in the seed.
Dataset make_synthetic(const Config& c, const models::Model& model) {
  Dataset d;
  d.name = "synthetic";
  d.sample_shape = model.sample_shape;
  d.classes = model.classes;
  d.tokens = model.token_input;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(c.train.seed ^ 0x5eed5eedULL);
  const int64_t n = c.data.samples + c.data.test_samples;
  std::vector<int64_t> shape{n};
  shape.insert(shape.end(), model.sample_shape.begin(), model.sample_shape.end());
  Split all;
  if (model.token_input) {
    // Sequences that mostly follow a fixed random successor table: next = succ[prev] with
    // probability 0.9, else a random token.
    const int64_t T = model.sample_shape.at(0), V = model.classes;
    auto succ = torch::randperm(V, gen, torch::kLong);
    auto seq = torch::empty({n, T + 1}, torch::kLong);
    seq.select(1, 0).random_(0, V, gen);
    auto noise = torch::rand({n, T}, gen);
    auto rnd = torch::randint(0, V, {n, T}, gen, torch::kLong);
    for (int64_t t = 0; t < T; ++t) {
      auto follow = succ.index_select(0, seq.select(1, t));
      seq.select(1, t + 1).copy_(torch::where(noise.select(1, t) < 0.9, follow, rnd.select(1, t)));
    }
    all.inputs = seq.narrow(1, 0, T).contiguous();
    all.targets = seq.narrow(1, 1, T).contiguous();
  } else {
    all.inputs = torch::randn(shape, gen);
    const int64_t features = all.inputs[0].numel();
    // Per-pixel targets: the sample's class + 1 where its first channel is positive, else 0.
    const int64_t classes = model.pixel_targets ? model.classes - 1 : model.classes;
    auto teacher = torch::randn({features, classes}, gen);
    all.targets = all.inputs.reshape({n, features}).matmul(teacher).argmax(1);
    if (model.pixel_targets) all.targets = pixel_targets(all.inputs.select(1, 0) > 0, all.targets);
  }
  d.train = {all.inputs.narrow(0, 0, c.data.samples), all.targets.narrow(0, 0, c.data.samples)};
  d.test = {all.inputs.narrow(0, c.data.samples, c.data.test_samples),
            all.targets.narrow(0, c.data.samples, c.data.test_samples)};
  return d;
}

int64_t numel(const std::vector<int64_t>& s) {
  return std::accumulate(s.begin(), s.end(), int64_t(1), std::multiplies<int64_t>());
}

Dataset load_kind(const Config& c, const models::Model& model) {
  switch (c.data.kind) {
    case DataKind::Synthetic: return make_synthetic(c, model);
    case DataKind::FashionMnist: return load_fashion(c);
    case DataKind::Text: return load_text(c, model);
    case DataKind::Tensors: return load_tensors(c, model);
    case DataKind::Tokens: return load_tokens(c, model);
  }
  throw InternalError(detail::concat("data: no loader for data.kind ", static_cast<int>(c.data.kind)));
}

}  // namespace

Dataset load_dataset(const Config& c, const models::Model& model) {
  Dataset d = load_kind(c, model);
  if (model.pixel_targets && c.data.kind == DataKind::FashionMnist) {
    // A segmentation of the images: each pixel brighter than a fifth of full scale is the
    // item's class + 1, the rest background (0).
    for (Split* s : {&d.train, &d.test}) s->targets = pixel_targets(s->inputs.select(1, 0) > 51, s->targets);
    d.classes = 11;
    d.name = "fashion-mnist (pixels)";
  } else if (model.pixel_targets && c.data.kind == DataKind::Text) {
    throw ConfigError(c.where("data.kind") + ": a per-pixel model needs images (fashion-mnist or synthetic)");
  }
  if (d.tokens != model.token_input || numel(d.sample_shape) != numel(model.sample_shape))
    throw ConfigError(c.where("data.kind") + ": data set " + d.name + " gives samples of shape " +
                      c10::str(c10::IntArrayRef(d.sample_shape)) + (d.tokens ? " (tokens)" : "") +
                      " but the model expects " + c10::str(c10::IntArrayRef(model.sample_shape)) +
                      (model.token_input ? " (tokens)" : ""));
  if (d.classes > model.classes)
    throw ConfigError(c.where("model") + ": the model has " + std::to_string(model.classes) +
                      " outputs but data set " + d.name + " has " + std::to_string(d.classes) + " classes");
  if (d.train.size() < c.data.batch_size)
    throw ConfigError(c.where("data.batch_size") + ": " + std::to_string(c.data.batch_size) +
                      " exceeds the " + std::to_string(d.train.size()) + " training samples");
  return d;
}

}  // namespace pipetrain::job
