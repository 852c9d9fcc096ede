// LoRA: low-rank adapters beside a block's projections (Hu et al., "LoRA: Low-Rank Adaptation of
// Large Language Models", 2021), as PEFT computes them: a targeted projection W x + b becomes
// W x + b + scaling · B (A (dropout(x))), A [rank, in] and B [out, rank] trained, W and b frozen
// (the `hf` family's "lora": every parameter but the adapters' frozen, models/hf_lora.cpp).
// scaling = alpha / rank (alpha / sqrt(rank) with rslora). A starts as torch's Linear's
// (Kaiming-uniform, a = sqrt(5)), B at zero, so the adapted model starts as the model.
// Parameters under the projection's name: "self_attn.q_proj.lora_A.weight", "…lora_B.weight",
// PEFT's names. Tests: tests/lora_test.cpp, tests/hf_lora.py (against PEFT).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace pipetrain {
class JsonReader;
}

namespace pipetrain::models {

/// A block's adapters (LlamaBlockOptions::lora).
struct Lora {
  int64_t rank = 0;     ///< 0: no adapters
  double alpha = 8;     ///< the adapters' output times alpha / rank
  double dropout = 0;   ///< keyed dropout of each adapter's input, training alone (the layer's masks)
  bool rslora = false;  ///< alpha / sqrt(rank) (rank-stabilized LoRA)
  std::vector<std::string> targets;  ///< the projections adapted, among lora_target_names()
  uint64_t stream = 0;  ///< the keyed dropouts' first stream; target i's is stream + i
  /// The adapters' output scale.
  double scaling() const;
  /// Whether `name` ("q_proj", …) is adapted.
  bool adapts(const std::string& name) const;
};

/// The projections a llama_block's adapters may target, in their stream order: q_proj, k_proj,
/// v_proj, o_proj, gate_proj, up_proj, down_proj.
const std::vector<std::string>& lora_target_names();

/// What a config's list of adapted projections says.
struct LoraTargets {
  bool all = false;                ///< "all" (or PEFT's "all-linear"): every projection there is
  std::vector<std::string> names;  ///< the names given (every name where `all`), without repeats
};

/// Reads `key` of `r`: "all", "all-linear" or a list of lora_target_names() without repeats;
/// absent, q_proj and v_proj (PEFT's default for Llama's). Anything else fails naming the key.
LoraTargets read_lora_targets(JsonReader& r, const std::string& key);

/// A Linear with an adapter: its own weight and bias (frozen by whoever freezes them), and
/// children lora_A and lora_B (Linears without biases). Cloned whole, adapters and each
/// parameter's requires_grad included.
class LoraLinearImpl : public torch::nn::LinearImpl {
 public:
  /// The projection `target` ("q_proj", …) from `in` to `out` values, with `lora`'s adapter.
  LoraLinearImpl(int64_t in, int64_t out, bool bias, Lora lora, const std::string& target);
  /// A copy with its adapter (torch's Linear's clone would make none), each parameter's values
  /// and requires_grad as here.
  std::shared_ptr<torch::nn::Module> clone(const std::optional<at::Device>& device = std::nullopt) const override;
  /// scaling · B (A (dropout(x))): what the adapter adds to the projection of x.
  at::Tensor adapter(const at::Tensor& x) const;

 private:
  Lora lora_;
  std::string target_;
  uint64_t stream_;
  double scaling_;
};

/// A block's projection `name` from `in` to `out` values: a LoraLinearImpl where `lora` adapts
/// it, torch's Linear otherwise.
torch::nn::Linear lora_linear(const Lora& lora, const std::string& name, int64_t in, int64_t out, bool bias);

/// A block's projection of x; with `bias_apart` the product rounded, then its bias added
/// (transformers' x @ W.T + b: GPT-OSS's, Falcon's); plus its adapter's output where it has one.
at::Tensor project(const torch::nn::Linear& l, const at::Tensor& x, bool bias_apart = false);

}  // namespace pipetrain::models
