// Cost files. Accepted costs are finite, non-negative and within their bounds.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "partitioner/cost_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    for (const auto& c : pipetrain::partitioner::parse_costs(text, "fuzz/costs.json"))
      if (!std::isfinite(c.forward_ms) || c.forward_ms < 0 || !std::isfinite(c.backward_ms) || c.backward_ms < 0 ||
          c.param_bytes < 0 || c.activation_bytes < 0 || c.saved_bytes < 0 || c.workspace_bytes < 0)
        std::abort();
  } catch (const pipetrain::ConfigError&) {
  }
  return 0;
}
