// profiler: measures the per-layer cost model (partitioner/cost.h) on this machine, on the device
// the stages will run on. Each layer runs alone as a pipeline stage on one micro-batch: forward,
// fused backward, and the zero-bubble split (B, W), each timed as the median of several runs
// after warm-up. Memory comes from a counting CPU allocator (on a GPU, the caching allocator's
// statistics): the bytes a layer's forward leaves alive with its graph are what it keeps for
// backward.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/container/sequential.h>

#include "partitioner/cost.h"
#include "partitioner/cost_file.h"
#include "stages/stage.h"

namespace pipetrain::profiler {

using partitioner::LayerCost;

struct ProfileOptions {
  int warmup = 2;
  int repeat = 5;
  int intra_op_threads = 1;  // as in a stage's worker thread
  Precision precision = Precision::FP32;  // as the stages compute (times and activation bytes in it)
  // Where the layers run: the model, input and target are moved there (and the model left
  // there). On a GPU, times are the device's (events around each operation, read once per
  // repetition) and memory the caching allocator's.
  c10::Device device{c10::kCPU};
  // Deferred weight gradients (PipelineOptions::defer_weight_grads, models/weight_grads.h): where
  // a layer has a weight of at least this many bytes (CPU, float32), its backward is also timed
  // with a stash in place, and the stash's flush. Negative: not measured.
  int64_t defer_min_bytes = 1 << 20;
};

struct Profile {
  std::vector<LayerCost> layers;
  std::vector<double> backward_input_ms, backward_weight_ms;  // B and W of each layer
  // What each layer holds between its B and its W beyond its saved bytes (the output gradients
  // W needs); empty: not measured (cost files).
  std::vector<int64_t> awaiting_weight_bytes;
  std::vector<double> optimizer_ms;                           // optimizer step of each layer; empty: not measured
  // With deferred weight gradients, per layer (empty: not measured, no weight large enough): its
  // backward with the large weights' gradients stashed, the flush of one micro-batch's stash (one
  // GEMM per weight over its rows), and the bytes the stash keeps per micro-batch until the flush.
  std::vector<double> deferred_backward_ms, flush_ms;
  std::vector<int64_t> deferred_bytes;
  int64_t input_bytes = 0;                                    // one micro-batch of model input
  int64_t micro_batch = 0;                                    // its samples
};

// `input` and `target` are one micro-batch; `loss` turns the last layer's output into a loss.
// The layers are used as they are (the caller's model): their gradients are cleared afterwards.
Profile profile_layers(torch::nn::Sequential model, const at::Tensor& input, const at::Tensor& target,
                       const stages::LossFn& loss, const ProfileOptions& options = {});

// Writes a cost file (partitioner/cost_file.h reads it) with the B and W split of each layer,
// and the model's `ties`.
void save_costs(const std::string& path, const Profile& profile, const std::vector<partitioner::TieCost>& ties = {});

// Live and peak bytes of CPU tensors allocated while counting is on (a process-wide counting
// allocator, installed on first use); also per memory account (common/memory_account.h: the
// device of the thread that allocated, a pipeline's stage), accounts 0 to 254.
class MemoryCounter {
 public:
  MemoryCounter();   // starts counting from zero
  ~MemoryCounter();  // stops counting
  int64_t live() const;
  int64_t peak() const;
  int64_t peak(int account) const;  // of the tensors threads of that account allocated
  void reset_peak();
};

// bf16's speed relative to float32 for a matrix product on this CPU (a 256x512 by 512x512
// product, one intra-op thread as a stage computes, the median of `repeat` runs of each): above 1
// faster, below 1 slower (stages::slow_bf16_warning reports it).
double bf16_speed(int repeat = 5);

}  // namespace pipetrain::profiler
