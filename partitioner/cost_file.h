// Cost files: a JSON array with one object per layer (name, forward_ms, backward_ms,
// param_bytes, activation_bytes, saved_bytes; other fields are ignored), as `pipetrain plan
// --save-costs` writes them and `partition --costs` and `plan --costs` read them. Errors name
// the file, the entry and the field; values beyond a day per layer or 2^60 bytes are refused.
#pragma once

#include <string>
#include <vector>

#include "partitioner/cost.h"

namespace pipetrain::partitioner {

std::vector<LayerCost> load_costs(const std::string& path);
// The costs in `text`, read from `path` (for messages).
std::vector<LayerCost> parse_costs(const std::string& text, const std::string& path);

}  // namespace pipetrain::partitioner
