// Mixed precision (the config's train.precision, bench --precision): the dtype that matrix
// products and convolutions compute in. Parameters, gradients and optimizer state stay float32
// whatever it is (master weights); stages/autocast.h turns it into libtorch's autocast state.
//   fp32  no autocast (the default)
//   bf16  autocast to bfloat16: float32's range, 8 bits of mantissa; no loss scaling needed
//   fp16  autocast to float16, with dynamic loss scaling (pipeline/loss_scale.h); the config
//         accepts it on GPUs only, the C++ API anywhere
#pragma once

#include <string>
#include <vector>

namespace pipetrain {

enum class Precision { FP32, BF16, FP16 };

// "fp32", "bf16", "fp16", in that order.
const std::vector<std::string>& precision_names();
const char* precision_name(Precision p);
// The precision of a name in precision_names(); ConfigError otherwise.
Precision parse_precision(const std::string& name);
// Bytes of one element in the precision's compute dtype (4, 2, 2).
int precision_bytes(Precision p);

}  // namespace pipetrain
