#include "common/precision.h"

#include "common/error.h"
#include "common/strings.h"

namespace pipetrain {

const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> names{"fp32", "bf16", "fp16"};
  return names;
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::FP32: return "fp32";
    case Precision::BF16: return "bf16";
    case Precision::FP16: return "fp16";
  }
  return "?";
}

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::FP32;
  if (name == "bf16") return Precision::BF16;
  if (name == "fp16") return Precision::FP16;
  throw ConfigError("unknown precision \"" + name + "\" (use " + join(precision_names(), ", ") + ")");
}

int precision_bytes(Precision p) { return p == Precision::FP32 ? 4 : 2; }

}  // namespace pipetrain
