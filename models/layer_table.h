// The layer types a layer list (model.family "layers") can spell, one row each: the name, the
// arguments with their kinds and defaults, the sample-shape rule, a line of help and the builder
// that reads the arguments, checks the input shape and makes the module. The list builder
// (layer_list.cpp), the argument check, the error messages, `pipetrain layers` and the table of
// docs/models.md are all read from it; the presets (mlp, cnn, gpt, unet) are lists of its rows.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include "common/json_reader.h"
#include "models/decoder.h"

namespace pipetrain::models {

/// One sample's shape (no batch dimension).
using Shape = std::vector<int64_t>;
/// "[16, 7, 7]".
std::string shape_text(const Shape& s);

/// What kind of JSON value an argument takes.
enum class ArgKind {
  Int,        ///< an integer
  Number,     ///< a number
  Bool,       ///< true or false
  String,     ///< a string (a skip's name)
  IntOrList,  ///< an integer or a list of integers
  List,       ///< a list of integers
  Layers,     ///< a list of layers
  Object,     ///< an object of its own keys
  Names,      ///< a string or a list of strings
};

/// One argument of a layer type.
struct LayerArg {
  std::string name;     ///< the JSON key, PyTorch's argument name where PyTorch has one
  ArgKind kind;         ///< the value it takes
  std::string def;      ///< its default as the docs write it; empty: required
};

/// Makes a layer's module (none for a function).
using Make = std::function<std::shared_ptr<torch::nn::Module>()>;
/// Runs a layer on its module.
using Run = std::function<at::Tensor(torch::nn::Module*, const at::Tensor&)>;
/// How a layer runs on the next positions alone (IncrementalLayer::forward_at); none: it cannot.
using Step = std::function<at::Tensor(torch::nn::Module*, const at::Tensor&, int64_t offset, KvCache&)>;

/// A layer's reading: its reader, its name for messages, its type, the sample shape it is given.
struct LayerContext {
  JsonReader& r;       ///< the layer's object
  std::string name;    ///< the layer's name, for messages
  std::string type;    ///< its type
  const Shape& in;     ///< the sample shape it is given
  bool tokens;         ///< the input holds token ids (only an embedding takes them)
  uint64_t stream;     ///< the first dropout stream it may use
  /// "<source>: <layer's path> (<name>): msg".
  [[noreturn]] void fail(const std::string& msg) const;
  /// Fails unless the input has `rank` dimensions per sample (`what` says which).
  void need_rank(size_t rank, const std::string& what) const;
  /// A required integer argument in [1, 2^30].
  int64_t positive(const std::string& key) const;
  /// A PyTorch dim over [batch, sample...] as a dim of the sample.
  int64_t sample_dim(int64_t dim, const std::string& key) const;
};

/// What a row builds: the module and how it runs, the output shape, what it draws and holds.
struct Built {
  Make make;                ///< the module's maker (none: a function)
  Run run;                  ///< the layer's computation
  bool per_position = false;  ///< it acts on each position apart (the sample's first dimension)
  Step step;                ///< its own step on the next positions (an embedding, a decoder block)
  std::string module_name;  ///< the module's short name in parameter names ("linear")
  Shape out;                ///< the output sample shape
  int random_streams = 0;   ///< dropout streams it uses (taken from the list's counter)
  double params = 0;        ///< values of its parameters and buffers, counted before they are made
};

/// One layer type.
struct LayerType {
  std::string name;                         ///< the JSON `type`
  std::vector<LayerArg> args;               ///< its arguments, in the docs' order
  std::string shape;                        ///< the sample-shape rule, as the docs write it
  std::string help;                         ///< one line
  std::function<Built(LayerContext&)> build;  ///< none: the list builder's own (skips, blocks)
};

/// Every layer type, in the docs' order.
const std::vector<LayerType>& layer_table();
/// The row named `type`, or null.
const LayerType* find_layer_type(const std::string& type);
/// The names of every row.
std::vector<std::string> layer_type_names();
/// Keys every layer may hold besides its type's arguments.
const std::vector<LayerArg>& common_layer_args();
/// Refuses a key of `layer` (a layer's object, read by `r`) that is neither a common key nor an
/// argument of `type`, and an argument of the wrong kind: one line naming the layer's index, its
/// type and the argument.
void check_layer_args(JsonReader& r, const nlohmann::json& layer, const LayerType& type);
/// The table of docs/models.md: a row per type.
std::string layer_table_markdown();

/// Builds a layer list from a spelled `model` object (input_shape, input_dtype, layers, ties):
/// what a preset does with the list it writes. `source` names it in messages.
struct Model;
Model build_spelled_list(const nlohmann::json& model, const std::string& source);

}  // namespace pipetrain::models
