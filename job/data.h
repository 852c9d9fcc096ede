// Data sets held in memory (or memory-mapped: data.kind tensors, job/tensors_data.h, and tokens,
// job/tokens_data.h), and the
// batch order of training. `fashion-mnist` reads the gzipped
// IDX files of Debian's dataset-fashion-mnist package; `synthetic` generates a learnable task
// for any model family from the seed, so every config runs without files; `text` reads any
// file as bytes for next-byte prediction with the `gpt` family (vocab_size 256).
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

#include "models/model.h"
#include "job/config.h"

namespace pipetrain::job {

struct Split {
  // [N, ...]: uint8 images, float features, int64 tokens, or uint8 bytes (text: overlapping
  // strided views of the file, widened to int64 per batch, so no window is copied at load).
  at::Tensor inputs;
  at::Tensor targets;  // [N] class ids or [N, T] next tokens
  int64_t size() const { return inputs.defined() ? inputs.size(0) : 0; }
};

struct Batch {
  at::Tensor input;
  at::Tensor target;
};

class Dataset {
 public:
  Split train, test;
  std::string name;
  std::vector<int64_t> sample_shape;
  int64_t classes = 0;
  bool tokens = false;
  bool images_u8 = false;  // inputs stored as uint8 pixels, normalised per batch
  bool widen_inputs = false;  // integer inputs (data.kind tensors) widened to float per batch
  // data.kind tokens: uint16/uint32 ids held as int16/int32 (job/tokens_data.h) are widened with
  // this mask per split; 0 for ids stored as they are.
  int64_t train_token_mask = 0, test_token_mask = 0;
  // The loss of a model-free predictor on the test targets, to judge a trained model by:
  // text: "unigram", each target byte predicted by the training bytes' frequencies (add-one
  // smoothing), in nats per byte. Other kinds: 0 and empty.
  double baseline_loss = 0;
  std::string baseline_name;

  // Training batch `step` (0-based): epochs are shuffled by (seed, epoch). An epoch's last
  // batch holds what is left (fewer than batch_size samples when batch_size does not divide the
  // split), or with `drop_last` is skipped so that every batch is full.
  Batch train_batch(int64_t step, int64_t batch_size, uint64_t seed, bool drop_last = false) const;
  // The samples of training batch `step` (without making it).
  int64_t train_batch_size(int64_t step, int64_t batch_size, bool drop_last = false) const;
  int64_t batches_per_epoch(int64_t batch_size, bool drop_last = false) const;
  // Test batch `index` (the last one may be smaller); `count` gives how many there are.
  Batch test_batch(int64_t index, int64_t batch_size) const;
  int64_t test_batches(int64_t batch_size) const;

 private:
  Batch make(const Split& s, const at::Tensor& index) const;
  mutable int64_t order_epoch_ = -1;  // the shuffled order of the current epoch, made once
  mutable at::Tensor order_;
};

// Loads the data set the config names, shaped for `model`; checks that the two agree.
Dataset load_dataset(const Config& config, const models::Model& model);

// Reads one gzipped (or plain) IDX file; throws DataError naming the file and the problem.
at::Tensor read_idx(const std::string& file);

// Reads a whole file as uint8 bytes; throws DataError naming the file and the problem.
at::Tensor read_bytes(const std::string& file);

// The `text` data set over `bytes`: the first (1 - test_fraction) of the bytes train, the rest
// test. A sample is a window of seq_len + 1 bytes (input: the first seq_len, target: the last
// seq_len); training windows start every `stride` bytes, test windows every seq_len bytes (each
// test byte is predicted once). `file` names the source in errors.
Dataset make_text(const at::Tensor& bytes, int64_t seq_len, double test_fraction, int64_t stride,
                  const std::string& file);

// Cross-entropy in nats of predicting each byte of `targets` by the byte frequencies of
// `train_bytes` with add-one smoothing.
double unigram_loss(const at::Tensor& train_bytes, const at::Tensor& targets);

}  // namespace pipetrain::job
