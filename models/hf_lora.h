// LoRA fine-tuning of the `hf` family (models/lora.h): "lora": {"rank", "alpha", "dropout",
// "rslora", "targets"} in the model section puts adapters beside the targeted projections of every
// llama_block and freezes every other parameter, as PEFT's get_peft_model does; `pipetrain export
// --format hf` writes the model with the adapters merged into its weights (W + scaling · B A),
// `--format peft` the adapters alone as PEFT writes them (adapter_config.json and
// adapter_model.safetensors, which PeftModel.from_pretrained loads over the source model).
// Tests: tests/lora_test.cpp, tests/hf_lora.py (against PEFT).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/json_reader.h"
#include "models/hf.h"
#include "models/lora.h"

namespace pipetrain::models {

/// The model section's "lora".
struct HfLora {
  Lora lora;  ///< rank 0 where the section has none
  /// "path": a directory PEFT wrote (adapter_config.json, adapter_model.safetensors) whose adapters
  /// the model starts from; its config gives rank, alpha, dropout, rslora and the targets.
  std::string path;
  std::vector<std::string> modules;  ///< with path: its target_modules, the checkpoint's module names
  std::string where;                 ///< the section's place, for errors
};

/// Reads the model section's "lora" (and with "path", the adapter's config): "rank", "alpha",
/// "dropout", "rslora" and "targets", llama_block's projection names (lora_target_names()) or
/// "all" ("all-linear", PEFT's name, too).
HfLora read_hf_lora(JsonReader& model);

/// Puts the adapters into each llama_block of `spec.layers` that has one of the targets (a block
/// without attention of its own or with experts takes only those it has); a ConfigError when no
/// block has any, or the model has no llama_block (GPT-2's gpt2_block). An adapter's
/// target_modules are found by the checkpoint's names of the projections.
void add_hf_lora(HfLora& lora, HfSpec& spec);

/// With `lora.path`, the adapter's tensors into `layers`' adapters ("base_model.model.<the
/// checkpoint's module>.lora_A.weight" into ours), every one checked for its place and shape, and
/// every adapter of the model given one.
void load_hf_adapter(const HfLora& lora, const HfSpec& spec, torch::nn::Module& layers);

/// Freezes every parameter of `layers` but the adapters' (requires_grad false).
void freeze_all_but_adapters(torch::nn::Module& layers);

/// Whether a parameter's name is an adapter's ("….lora_A.weight", "….lora_B.weight").
bool is_adapter(const std::string& name);

/// Merges the adapters in `weights` (our names) into their projections' weights, W + scaling · B A
/// computed in float64 and rounded once to W's type, and drops them; `model` is the model section
/// the weights were trained under (its "lora" gives the scaling). Nothing where it has no "lora".
void merge_adapters(std::map<std::string, at::Tensor>& weights, const nlohmann::json& model);

/// Writes the adapters in `weights` as PEFT writes a LoRA adapter into `out`: adapter_config.json
/// (r, lora_alpha, lora_dropout, use_rslora, target_modules by the checkpoint's module names,
/// base_model_name_or_path `source`) and adapter_model.safetensors ("base_model.model.<the
/// checkpoint's module>.lora_A.weight", …). A ConfigError where the model has no adapters or a
/// projection is part of a fused tensor of the checkpoint (GPT-NeoX's query_key_value), which no
/// PEFT adapter of the checkpoint's modules can express. Returns the tensors written.
size_t save_peft(const std::string& source, const std::map<std::string, at::Tensor>& weights, const nlohmann::json& model,
                 const std::string& out);

}  // namespace pipetrain::models
