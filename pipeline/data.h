// Data sets held in memory, and the batch order of training. `fashion-mnist` reads the gzipped
// IDX files of Debian's dataset-fashion-mnist package; `synthetic` generates a learnable task
// for any model family from the seed, so every config runs without files.
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

#include "models/model.h"
#include "pipeline/config.h"

namespace pipetrain::pipeline {

struct Split {
  at::Tensor inputs;   // [N, ...]: uint8 images, float features or int64 tokens
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

  // Training batch `step` (0-based): epochs are shuffled by (seed, epoch); a last partial batch
  // of an epoch is skipped so every step has batch_size samples.
  Batch train_batch(int64_t step, int64_t batch_size, uint64_t seed) const;
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

}  // namespace pipetrain::pipeline
