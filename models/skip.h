// Skip connections across layers, and so across stages, as torchgpipe's stash/pop: a layer
// stashes a named tensor that a later layer pops (a U-Net's encoder feature map, taken up again
// by its decoder). Within one forward of a layer list, stash() and pop() talk through the calling
// thread's skip context (common/skip.h); a pipeline stage opens a context holding the skips that
// crossed into it and passes what is left when its layers are done — the skips stashed and not yet
// popped — on to the next stage with its output, so a skip crosses every stage boundary between
// its stash and its pop (and its gradient crosses them back).
//
// Layers that stash or pop say so (SkipDeclaring), so that a pipeline knows, from the layer
// list alone, which skips cross which boundary; a user's own layer does the same, or the
// pipeline is told the skips (PipelineOptions::skips).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include "common/skip.h"

namespace pipetrain::models {

/// The named tensors one micro-batch carries between layers (stashed, not yet popped).
using Skips = SkipMap<at::Tensor>;
/// Makes a Skips the calling thread's skip context for the duration of a scope.
using TensorSkipScope = SkipScope<at::Tensor>;

/// Puts `t` under `name` in the calling thread's skip context (an error if it already holds it,
/// or if no context is open).
inline void stash(const std::string& name, const at::Tensor& t) { stash_skip<at::Tensor>(name, t); }
/// Takes the tensor stashed under `name` out of the context (an error naming it if absent).
inline at::Tensor pop(const std::string& name) { return pop_skip<at::Tensor>(name); }

/// A layer that stashes or pops skips declares their names.
class SkipDeclaring {
 public:
  virtual ~SkipDeclaring() = default;
  virtual std::vector<std::string> stashes() const { return {}; }  ///< the names its forward stashes
  virtual std::vector<std::string> pops() const { return {}; }     ///< the names its forward pops
};

/// One skip of a layer list: stashed by layer `stash_layer`, popped by layer `pop_layer` (> it).
struct Skip {
  std::string name;      ///< what stash() and pop() call it
  int stash_layer = -1;  ///< the layer that stashes it
  int pop_layer = -1;    ///< the later layer that pops it
};

/// The skips of `layers`, from the layers that declare them, in stash order. Throws ConfigError
/// for a name stashed twice, popped before it is stashed, or never popped.
std::vector<Skip> skips_of(const torch::nn::Sequential& layers);

/// Checks skips given by hand against a layer count (names unique, 0 <= stash < pop < layers).
void check_skips(const std::vector<Skip>& skips, int layers, const std::string& where);

/// For each cut after virtual stage b of a split into consecutive layer ranges starting at
/// `offsets` (partitioner::offsets: offsets[b] .. offsets[b+1]-1), the names of the skips that
/// cross it (stashed at or before its last layer, popped after), sorted.
std::vector<std::vector<std::string>> skips_crossing(const std::vector<Skip>& skips, const std::vector<int>& offsets);

/// The layers' forward on one device, inside a skip context of its own: every skip stashed is
/// popped within (an error names one left over).
at::Tensor forward_with_skips(torch::nn::Sequential layers, const at::Tensor& input);

/// Identity that stashes its input under `name`.
class StashImpl : public torch::nn::Cloneable<StashImpl>, public SkipDeclaring {
 public:
  explicit StashImpl(std::string name) : name_(std::move(name)) {}  ///< stashes under `name`
  void reset() override {}                                          ///< no parameters
  at::Tensor forward(const at::Tensor& x);                          ///< stashes `x`, returns it
  std::vector<std::string> stashes() const override { return {name_}; }  ///< {name}

 private:
  std::string name_;
};
TORCH_MODULE(Stash);

}  // namespace pipetrain::models
