// Checkpoints: one directory per saved step under a root directory.
//
//   ROOT/step-00000100/manifest.json   step, data position, random-stream step, the identity of the
//                                      run (model, data, optimizer, seed, accumulation, dtype) and
//                                      its hash, the stage layout, and each shard's size and CRC-32
//   ROOT/step-00000100/stage-0.pt …    one shard per virtual stage: its layers' parameters and
//                                      buffers under their model names ("block0.attn.qkv.weight"),
//                                      its optimizer's state per parameter
//                                      ("optimizer/<name>/exp_avg"), and in shard 0 the state of
//                                      torch's CPU generator ("rng/torch_cpu")
//
// A shard is a dict of named tensors in the format of torch.save, so Python's torch.load reads it.
// A checkpoint is written under a hidden partial name, every file fsync'ed, the manifest last,
// then renamed into place: a run killed mid-save keeps its previous checkpoint as the latest
// complete one. Tensors are keyed by model name, never by stage, so a checkpoint loads into any
// stage count or schedule.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/nn/modules/container/sequential.h>

#include "common/error.h"
#include "pipeline/pipeline.h"
#include "job/config.h"
#include "checkpoint/manifest.h"

namespace pipetrain::checkpoint {


using pipeline::Pipeline;

struct CheckpointState {
  std::string dir;            // the step directory
  int64_t step = 0;           // optimizer steps done
  int64_t batches = 0;        // training batches consumed: the data position
  int64_t pipeline_step = 0;  // forward-backward passes run: the step of the dropout streams
  int stages = 0;             // devices of the run that wrote it
  nlohmann::json manifest;
};

// What must not change for a checkpoint to continue a run: model, data, optimizer, train.seed,
// train.accumulate and runtime.dtype. Stage count, schedule, balance and steps may change.
nlohmann::json training_identity(const job::Config& config);

// Writes the checkpoint of optimizer step `step` under `root` and returns its directory; keeps
// the newest `keep` checkpoints (older ones are removed once the new one is complete).
std::string save_checkpoint(const std::string& root, const job::Config& config, Pipeline& pipe, int64_t step,
                            int64_t batches, int keep);

// Makes `root` if needed and checks that a file can be written and removed there; ConfigError
// "<where>: <root>: <reason>" otherwise.
void check_checkpoint_dir(const std::string& root, const std::string& where);

// The newest complete checkpoint under `root`, or "" when there is none (or no such directory).
std::string latest_checkpoint(const std::string& root);
// `path` itself when it holds a manifest, else latest_checkpoint(path); throws when neither.
std::string find_checkpoint(const std::string& path);

// Reads and checks `dir` (manifest, shard sizes and checksums, the run's identity against
// `config`, every tensor's name, shape and dtype), then loads parameters, buffers, optimizer state
// (for every stage with an optimizer set) and torch's generator state into `pipe`.
CheckpointState load_checkpoint(const std::string& dir, const job::Config& config, Pipeline& pipe);

// Parameters and buffers only, into a whole model; only the model section must match.
CheckpointState load_weights(const std::string& dir, const job::Config& config, torch::nn::Sequential& model,
                             const std::vector<models::Tie>& ties = {});

// The model section of the config the checkpoint `dir` was saved under (its manifest's identity).
nlohmann::json checkpoint_model(const std::string& dir);
// The merged parameters and buffers of the whole model, in layer order (a tied parameter once,
// under its first member's name), checked as load_checkpoint checks them.
std::vector<std::pair<std::string, at::Tensor>> checkpoint_weights(const std::string& dir);

// Writes the merged parameters and buffers of the whole model, in layer order, as one
// torch.load-readable dict of named tensors (written atomically); returns how many tensors.
size_t export_checkpoint(const std::string& dir, const std::string& out);

}  // namespace pipetrain::checkpoint
