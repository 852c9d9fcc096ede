// models: builders of flat, named layer lists (torch::nn::Sequential) from the `model` section
// of a config. A family is one builder function; the registry maps names to builders.
// Building under the same seed gives the same weights whatever the stage count or runtime,
// because the whole model is built once, in order, before it is split into stages.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <torch/nn/modules/container/sequential.h>

#include "common/json_reader.h"

namespace pipetrain::models {

// A parameter of one layer of a list: the layer's index and the parameter's name within it
// (e.g. {0, "tok.weight"}).
struct ParamRef {
  int layer = 0;
  std::string name;
};
// Parameters that are one weight (a language model's token embedding and output head): each
// layer keeps its own tensor, equal at the start; a trainer sums their gradients and applies the
// same update to each, so they stay equal (pipeline.h).
using Tie = std::vector<ParamRef>;

struct Model {
  torch::nn::Sequential layers;
  std::vector<int64_t> sample_shape;  // shape of one input sample, e.g. {1, 28, 28} or {seq_len}
  bool token_input = false;           // input holds integer token ids rather than floats
  int64_t classes = 0;                // size of the output's last dimension
  bool pixel_targets = false;         // one class per pixel of the image (a segmentation), not per sample
  std::vector<Tie> ties;
};

// Reads the family's keys from `model` (the reader of the `model` object, without `family`).
using Builder = std::function<Model(JsonReader& model)>;

// Adds or replaces a family (a user's own model family, for example).
void register_family(const std::string& name, Builder builder);
std::vector<std::string> families();

// Reads `model.family`, builds it with torch's generator seeded by `seed`, and checks the keys.
Model build(JsonReader& model, uint64_t seed);

// Layer names in order, e.g. {"embed", "block0", ..., "norm", "head"}.
std::vector<std::string> layer_names(const torch::nn::Sequential& layers);

}  // namespace pipetrain::models
