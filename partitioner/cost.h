// partitioner cost model: what a stage costs in time and memory, from per-layer costs of one
// micro-batch, the device the stage runs on and what the schedule keeps in flight. The exact
// partitioner (partition.h) compares exactly the values these functions return.
#pragma once

#include "common/recompute.h"

#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain::partitioner {

// Measured or estimated costs of one layer for one micro-batch on a device of speed 1.
struct LayerCost {
  std::string name;              // shown in error messages
  double forward_ms = 0;         // forward time; finite, >= 0
  double backward_ms = 0;        // backward time (with any recomputed forward); finite, >= 0
  int64_t param_bytes = 0;       // the layer's parameters
  int64_t activation_bytes = 0;  // the layer's output: the next stage's input when a stage ends here
  int64_t saved_bytes = 0;       // what the layer keeps for backward (includes its output when kept)
  // Transient bytes above what the layer keeps, at the peak of its forward or its backward
  // (temporaries, the input gradient, a weight gradient before it is added to the accumulated
  // one): one layer runs at a time on a stage, so a stage needs the largest of its layers'.
  int64_t workspace_bytes = 0;
  // The backward's two parts when known (a cost file may give them): B, the input gradient, and
  // W, the weight gradients; negative when not given.
  double backward_input_ms = -1, backward_weight_ms = -1;
  // The bytes of the parameters that train (gradients and optimizer state follow them); negative:
  // all of them (a cost file without the field). LoRA's frozen weights (models/hf_lora.h) train not.
  int64_t trainable_bytes = -1;
  int64_t trained_bytes() const { return trainable_bytes < 0 ? param_bytes : trainable_bytes; }
};

// Tied parameters (PipelineOptions::ties) as costs see them: the layers that hold a tie's
// members, first member first, and the bytes of one member (its gradient travels at the
// optimizer step between the devices that hold them: planner::add_ties).
struct TieCost {
  std::vector<int> layers;
  int64_t bytes = 0;
};

// The device a stage runs on; stage j runs on device j.
struct Device {
  double speed = 1.0;        // relative throughput: stage time = layer time / speed; finite, > 0
  int64_t memory_limit = 0;  // bytes the stage may hold at its peak; 0 = no limit
};

// What a stage holds at its peak, besides its parameters.
struct MemoryModel {
  double state_factor = 2.0;   // gradient + optimizer bytes per parameter byte (SGD+momentum 2,
                               // Adam 3); finite, >= 0
  std::vector<int> in_flight;  // per stage: micro-batches whose activations the stage holds at its
                               // peak (from the schedule), each >= 1; empty = 1 for every stage
  Recompute recompute = Recompute::Never;  // which micro-batches a stage re-runs in backward
  int64_t input_bytes = 0;  // the model input of one micro-batch (the first stage's input)
};

// Forward + backward of one micro-batch on a device of speed 1.
inline double layer_ms(const LayerCost& c) { return c.forward_ms + c.backward_ms; }

// Time of one micro-batch (forward + backward) through layers [begin, end) on `device`:
// (R(end) - R(begin)) / speed, where R(i) is the running sum of layer_ms over the layers before
// i, accumulated in layer order. Using running sums (not a fresh sum from `begin`) makes this
// bit-identical to the prefix-sum differences min_max compares, so its bottleneck can be checked
// for equality. Requires 0 <= begin < end <= costs.size().
double stage_time(const std::vector<LayerCost>& costs, int begin, int end, const Device& device);

// Peak bytes of a stage from its sums (see stage_memory); f = micro-batches in flight:
//   params + ceil(trained * state_factor) + activations, where trained is the bytes of the
//   parameters that train (negative: params), and activations is
//   Never: f * saved;  Always: f * input + saved;  ExceptLast: (f - 1) * input + saved.
int64_t memory_bytes(int64_t params, int64_t saved, int64_t input, int in_flight, const MemoryModel& model,
                     int64_t trained = -1);

// Predicted peak bytes of stage `stage` holding layers [begin, end): memory_bytes of the sums of
// param_bytes, trained_bytes() and saved_bytes over the layers, with input = the stage's input of one micro-batch
// (model.input_bytes for begin == 0, else costs[begin - 1].activation_bytes) and
// f = model.in_flight[stage] (1 when in_flight is empty), plus the largest workspace_bytes of
// the layers.
int64_t stage_memory(const std::vector<LayerCost>& costs, int begin, int end, int stage,
                     const MemoryModel& model);

}  // namespace pipetrain::partitioner
