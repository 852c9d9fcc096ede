// Cost files: a JSON array with one object per layer (name, forward_ms, backward_ms,
// param_bytes, activation_bytes, saved_bytes, and optionally backward_input_ms and
// backward_weight_ms, which go together (measured apart, they may add up to more than the fused
// backward_ms); other fields are ignored), as
// `pipetrain plan --save-costs` writes them and `partition --costs`, `plan --costs` and
// `simulate --costs` read them. The array may instead be the "layers" of an object that also
// describes the link between devices: {"layers": [...], "link": {"bandwidth_gb_s": 50,
// "latency_ms": 0.01}} (as `pipetrain costs transformer` writes). Errors name the file, the
// entry and the field; values beyond a day per layer or 2^60 bytes are refused.
#pragma once

#include <string>
#include <vector>

#include "partitioner/cost.h"

namespace pipetrain::partitioner {

struct CostFile {
  std::vector<LayerCost> layers;
  double bandwidth_gb_s = 0;  // 0: not given
  double latency_ms = 0;
  bool split_given = false;   // every layer has backward_input_ms and backward_weight_ms
};

CostFile load_cost_file(const std::string& path);
// The costs in `text`, read from `path` (for messages).
CostFile parse_cost_file(const std::string& text, const std::string& path);
std::vector<LayerCost> load_costs(const std::string& path);  // the layers only
std::vector<LayerCost> parse_costs(const std::string& text, const std::string& path);

}  // namespace pipetrain::partitioner
