// Cost files: a JSON array with one object per layer (name, forward_ms, backward_ms,
// param_bytes, activation_bytes, saved_bytes, optionally workspace_bytes (a layer's transient
// bytes above what it keeps; partitioner/cost.h), and optionally backward_input_ms and
// backward_weight_ms, which go together (measured apart, they may add up to more than the fused
// backward_ms); other fields are ignored), as
// `pipetrain plan --save-costs` writes them and `partition --costs`, `plan --costs`,
// `plan --auto --costs` and `simulate --costs` read them. The array may instead be the "layers"
// of an object that also describes the link between devices, the micro-batch the costs are for
// and the devices to plan for:
//   {"layers": [...], "link": {"bandwidth_gb_s": 50, "latency_ms": 0.01},
//    "micro_batch": 4, "input_bytes": 65536,
//    "devices": [{"speed": 1, "bandwidth_gb_s": 50}, {"speed": 0.5}, ...],
//    "ties": [{"layers": [0, 33], "bytes": 411041792}]}
// (`pipetrain costs transformer` and `plan --save-costs` write the first four). `micro_batch` is
// the samples per micro-batch the costs were taken on (plan --auto scales them to other sizes);
// `input_bytes` one such micro-batch of model input; each device's `speed` scales its compute
// and its `bandwidth_gb_s` (default: the link's) its transfers and reductions; `ties` the model's
// tied parameters (TieCost: their layers, one member's bytes), which `plan --save-costs` and
// `costs transformer --tie-embeddings` write. Errors name the
// file, the entry and the field; values beyond a day per layer or 2^60 bytes are refused.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "partitioner/cost.h"

namespace pipetrain::partitioner {

struct DeviceCost {
  double speed = 1;           // relative compute speed
  double bandwidth_gb_s = 0;  // its link; 0: the file's link
};

struct CostFile {
  std::vector<LayerCost> layers;
  double bandwidth_gb_s = 0;  // 0: not given
  double latency_ms = 0;
  bool split_given = false;   // every layer has backward_input_ms and backward_weight_ms
  int64_t micro_batch = 0;    // samples per micro-batch the costs are for; 0: not given
  int64_t input_bytes = 0;    // model input of one such micro-batch; 0: not given
  std::vector<DeviceCost> devices;  // empty: not given
  std::vector<TieCost> ties;        // empty: none given
};

// Writes `file` in the object form (layers, link, and micro_batch, input_bytes and devices where
// given), so that load_cost_file reads back the same costs.
void write_cost_file(std::ostream& out, const CostFile& file);

// The costs for micro-batches of `rows` samples: times, activation, saved and input bytes scaled
// by rows / micro_batch (linearly: small micro-batches use a device less well than this
// assumes), parameters unchanged. ConfigError naming `path` when the file has no micro_batch.
CostFile scaled_to_rows(const CostFile& file, int64_t rows, const std::string& path);

CostFile load_cost_file(const std::string& path);
// The costs in `text`, read from `path` (for messages).
CostFile parse_cost_file(const std::string& text, const std::string& path);
std::vector<LayerCost> load_costs(const std::string& path);  // the layers only
std::vector<LayerCost> parse_costs(const std::string& text, const std::string& path);

}  // namespace pipetrain::partitioner
