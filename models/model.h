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
#include "common/precision.h"

/// Models as layer lists: the families built from configs and the description of a user's layers.
namespace pipetrain::models {

/// A parameter of one layer of a list: the layer's index and the parameter's name within it
/// (e.g. {0, "tok.weight"}).
struct ParamRef {
  int layer = 0;     ///< the layer's index in the list
  std::string name;  ///< the parameter's name within the layer, e.g. "linear.weight"
};
/// Parameters that are one weight (a language model's token embedding and output head): each
/// layer keeps its own tensor, equal at the start; a trainer sums their gradients and applies the
/// same update to each, so they stay equal (pipeline.h).
using Tie = std::vector<ParamRef>;

/// A model family's build: the layer list and what its data must look like.
struct Model {
  torch::nn::Sequential layers;       ///< named layers, in order
  std::vector<int64_t> sample_shape;  ///< shape of one input sample, e.g. {1, 28, 28} or {seq_len}
  bool token_input = false;           ///< input holds integer token ids rather than floats
  int64_t classes = 0;                ///< size of the output's last dimension
  bool pixel_targets = false;         ///< one class per pixel of the image (a segmentation), not per sample
  std::vector<Tie> ties;              ///< parameters that are one weight (the gpt's tie_embeddings)
  /// model.frozen_dtype: the type store_frozen keeps frozen Linear weights in; FP32 (the default):
  /// the runtime's, as every other parameter.
  Precision frozen = Precision::FP32;
};

/// Reads the family's keys from `model` (the reader of the `model` object, without `family`).
using Builder = std::function<Model(JsonReader& model)>;

/// Adds or replaces a family (a user's own model family, for example).
void register_family(const std::string& name, Builder builder);
/// The names of the registered families, in registration order.
std::vector<std::string> families();

/// Reads `model.family`, builds it with torch's generator seeded by `seed`, and checks the keys.
/// `model.freeze` (any family): patterns of parameter names (fnmatch's globs, "layer_0.*") whose
/// parameters train not (requires_grad false); one that matches nothing, freezing everything, or
/// freezing a tie in part is a ConfigError. `model.frozen_dtype` ("fp32", "bf16", "fp16") sets
/// Model::frozen (store_frozen applies it; job::build_model does, after the runtime's dtype).
Model build(JsonReader& model, uint64_t seed);

/// Layer names in order, e.g. {"embed", "block0", ..., "norm", "head"}.
std::vector<std::string> layer_names(const torch::nn::Sequential& layers);

/// Keeps the frozen weights of m's Linear modules (requires_grad false; not a tie's) in the
/// dtype of m.frozen (bfloat16, float16), from float32: half their bytes, and under autocast to
/// that dtype the very products of float32 weights cast at each use, without the casts (autocast
/// caches no cast of a frozen weight: each forward makes its own, which the backward keeps).
/// Returns how many it changed (none where m.frozen is FP32). Biases, norms, embeddings and
/// weights held otherwise stay as they are.
size_t store_frozen(Model& m);
/// The weights store_frozen keeps in m.frozen's dtype: the frozen weights of m's Linear modules
/// that are no tie's, each once, in whatever type they are now.
std::vector<at::Tensor> frozen_linear_weights(const Model& m);
/// Brings the weights store_frozen changed back to float32 (their values exactly), for what runs
/// without autocast (generation).
void widen_frozen(Model& m);

/// The parameters of `m` that train (requires_grad): what optimizers step and gradients reduce
/// over; a frozen parameter (LoRA's base weights, models/hf_lora.h) has no gradient and no state.
std::vector<at::Tensor> trainable_parameters(const torch::nn::Module& m);

}  // namespace pipetrain::models
