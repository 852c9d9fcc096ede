// Quantized Hugging Face checkpoints, dequantized as they are read: the `hf` family (models/hf.h)
// trains and exports weights in a floating-point type, and reads the two forms in which the
// largest open models are published with weights of 8 bits or fewer:
//
// - "fp8" (transformers' FineGrainedFP8Config; DeepSeek-V3 and R1, the Qwen3 -FP8 checkpoints,
//   MiniMax-M2): a weight `W` in float8_e4m3fn beside `W_scale_inv`, one float per block of
//   weight_block_size [rows, columns] (the last block of each dimension may be short: the grid is
//   ceil(rows / block rows) x ceil(columns / block columns), as DeepSeek's own dequantization reads
//   it), or one for the whole tensor where weight_block_size is null. W = float32(q) * scale,
//   rounded once in float32 (transformers' and DeepSeek's dequantization).
// - "mxfp4" (transformers' Mxfp4Config; gpt-oss-20b and 120b): the stacked experts `E` [experts,
//   in, out] held as `E_blocks` [experts, out, in / 32, 16] (two FP4 e2m1 codes a byte, the even
//   element in the low half) and `E_scales` [experts, out, in / 32] (a power of two a group of 32,
//   biased by 127), transposed back to transformers' layout: exact in float32.
//
// - "compressed-tensors" (the format llm-compressor writes and vLLM serves: RedHat's and many
//   others' W4A16, W8A8, FP8 and NVFP4 checkpoints): each config group's weights as its format
//   stores them (models/hf_compressed.cpp): "pack-quantized" (integers of 1 to 8 bits packed into
//   int32 words, `weight_packed`, `weight_shape`, zero points packed along the rows where
//   asymmetric), "int-quantized", "float-quantized" and "naive-quantized" (int8 or float8
//   `weight`), "nvfp4-pack-quantized" (two e2m1 codes a byte, float8 scales per 16, a global
//   scale); strategies tensor, channel, group, tensor_group and block. A weight is (q - zero
//   point) * scale in the scale's type, as compressed-tensors dequantizes it (NVFP4's in float32,
//   rounded to bfloat16). The activations' quantization (input scales, the kv cache's) is an
//   inference matter and is not applied: the model is the dequantized one transformers loads.
//
// What a tensor is read as follows from what the checkpoint holds (a weight with scales beside it,
// blocks with scales), so modules_to_not_convert needs no reading. A tensor in 8-bit floats
// without its scales, scales of the wrong grid, and any other quantization method are one-line
// ConfigErrors naming the file and the tensor or the field. Tests: tests/hf_quantized_test.cpp,
// tests/hf_test.cpp (HfParity.*Fp8*, *Mxfp4*: against transformers' dequantized models).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "models/safetensors.h"

namespace pipetrain::models {

/// A compressed-tensors config group: how the weights of the modules it targets are stored.
struct HfCompressedGroup {
  std::string name;                  ///< its key in config_groups ("group_0")
  std::vector<std::string> targets;  ///< "Linear" (any projection), a module's name, or "re:" and a pattern of names
  std::string format;                ///< pack-quantized, int-quantized, float-quantized, naive-quantized, nvfp4-pack-quantized
  std::string type;                  ///< "int" or "float"
  int64_t bits = 8;                  ///< num_bits
  std::string strategy;              ///< tensor, channel, group, tensor_group or block
  int64_t group_size = 0;            ///< group and tensor_group: the columns one scale covers
  std::vector<int64_t> block;        ///< block: block_structure {rows, columns}
  bool symmetric = true;             ///< false: zero points beside the scales
};

/// config.json's quantization_config, checked.
struct HfQuantization {
  std::string method;          ///< "" (none), "fp8", "mxfp4" or "compressed-tensors"
  std::vector<int64_t> block;  ///< fp8: weight_block_size {rows, columns}; empty: one scale per tensor
  std::vector<HfCompressedGroup> groups;  ///< compressed-tensors: config_groups that quantize weights
  /// Whether the checkpoint is quantized.
  bool any() const { return !method.empty(); }
};

/// Checks `q` (config.json's quantization_config; `where` names it in errors): quant_method "fp8"
/// (fmt "e4m3", activation_scheme "dynamic": weights alone are quantized, the activations are not
/// rescaled by stored factors), "mxfp4" or "compressed-tensors" (quantization_status "compressed",
/// the formats above, no sparsity); anything else is a ConfigError naming the field.
HfQuantization read_hf_quantization(const nlohmann::json& q, const std::string& where);

/// The checkpoint's tensors as a model reads them: a tensor as stored, or dequantized (float32)
/// from its quantized form.
class HfWeights {
 public:
  /// Reads `ck` (which must outlive this) as `q` says; `where` prefixes errors.
  HfWeights(const SafetensorsCheckpoint& ck, HfQuantization q, std::string where);
  /// Whether `name` is stored, or stored in a quantized form (`name`_blocks and `name`_scales).
  bool contains(const std::string& name) const;
  /// The tensor `name`, dequantized where quantized; `from` (if not null) gains the checkpoint's
  /// names it was read from (the tensor, its scales, its blocks). ConfigError naming the file and
  /// the tensor for 8-bit floats without their scales or a grid of scales that does not fit. The
  /// last few tensors dequantized are kept, so that a stack read expert by expert (a slice each)
  /// is dequantized once.
  at::Tensor get(const std::string& name, std::vector<std::string>* from = nullptr) const;
  /// The file that holds `name` (or its blocks, or its packed form).
  const std::string& file_of(const std::string& name) const;
  /// Whether `name` is a stored tensor of the quantization that the model does not read: a
  /// compressed-tensors checkpoint's activation and kv-cache scales (input_scale, k_scale, ...).
  bool inert(const std::string& name) const;

 private:
  const SafetensorsCheckpoint& ck_;
  HfQuantization q_;
  std::string where_;
  at::Tensor read(const std::string& name, std::vector<std::string>* from) const;
  struct Recent {  // a dequantized tensor and the checkpoint's names it was read from
    std::string name;
    at::Tensor tensor;
    std::vector<std::string> from;
  };
  mutable std::vector<Recent> recent_;  // newest last
};

/// The fp8 weight `q` [..., rows, columns] times its scales `scale` [..., ceil(rows / block[0]),
/// ceil(columns / block[1])] (one scale of any shape holding one element where `block` is empty),
/// in float32. Scales stored as bytes are powers of two biased by 127 (UE8M0). `what` names the
/// tensor in a ConfigError when the grid does not fit.
at::Tensor dequantize_fp8(const at::Tensor& q, const at::Tensor& scale, const std::vector<int64_t>& block, const std::string& what);

/// compressed-tensors' group for the module `module` (a weight's name without ".weight"): the one
/// whose targets name it (its name, or a "re:" pattern matching from its start), else the one
/// targeting "Linear". ConfigError naming `what` where none or several fit.
const HfCompressedGroup& compressed_group(const HfQuantization& q, const std::string& module, const std::string& what);

/// The integers packed by compressed-tensors' pack-quantized format: `packed` [rows, words] (int32)
/// holds each row's `cols` values of `bits` bits as one little-endian stream (value i at bit
/// i * bits, offset by 2^(bits - 1)); they come back as int64 [rows, cols], in [-2^(bits-1),
/// 2^(bits-1)). ConfigError naming `what` where the words do not fit.
at::Tensor unpack_compressed_ints(const at::Tensor& packed, int64_t bits, int64_t cols, const std::string& what);

/// The stored parts of one compressed-tensors weight: `weight` (int8 or float8 codes) or `packed`
/// (with `shape`), `scale`, and where stored `zero_point` and `global_scale`.
struct HfCompressedParts {
  at::Tensor weight, packed, shape, scale, zero_point, global_scale;
};

/// The weight the parts hold under group `g`, as compressed-tensors dequantizes it; `what` names it
/// in a ConfigError where the parts do not fit the group (types, shapes, grids).
at::Tensor dequantize_compressed(const HfCompressedGroup& g, const HfCompressedParts& parts, const std::string& what);

/// MXFP4 `blocks` [..., rows, groups, 16] (bytes) and `scales` [..., rows, groups] (bytes) as
/// float32 [..., rows, groups * 32]; `what` names the tensor in a ConfigError when they do not fit.
at::Tensor dequantize_mxfp4(const at::Tensor& blocks, const at::Tensor& scales, const std::string& what);

// The parts of HfWeights that models/hf_compressed.cpp holds.

/// FP4 (e2m1) codes, two a byte with the even element in the low half, as float32 [..., 2 * n].
at::Tensor fp4_values(const at::Tensor& bytes);
/// read_hf_quantization's part for quant_method "compressed-tensors".
HfQuantization read_compressed_tensors(const nlohmann::json& q, const std::string& where);
/// Whether `name` is stored in a compressed form in `ck` (its packed form, or scales beside it).
bool compressed_in(const SafetensorsCheckpoint& ck, const std::string& name);
/// HfWeights::get's part for compressed-tensors: the weight `name` dequantized; `from` gains the
/// names read; `where` prefixes errors.
at::Tensor read_compressed(const SafetensorsCheckpoint& ck, const HfQuantization& q, const std::string& name,
                           std::vector<std::string>* from, const std::string& where);

}  // namespace pipetrain::models
