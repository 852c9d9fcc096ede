// job: the run layer's base, from a config to a Pipeline. config.h reads and validates a JSON
// config (plus overrides) into typed sections, every closed set parsed once into its enum
// (job/choices.h, comm/backend.h, schedule/kinds.h, common/); every mistake is a one-line
// ConfigError naming the file or the override and the key path.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/backend.h"
#include "common/json_reader.h"
#include "common/optimizer_kind.h"
#include "common/precision.h"
#include "common/recompute.h"
#include "job/choices.h"
#include "schedule/kinds.h"

namespace pipetrain::job {

struct DataConfig {
  DataKind kind = DataKind::Synthetic;  // data.kind: job/choices.cpp has a row for each
  int64_t batch_size = 64;
  std::string path = "/usr/share/datasets/fashion-mnist";  // IDX folder; for text the file (required)
  int64_t samples = 8192;       // synthetic train split size
  int64_t test_samples = 1024;  // synthetic test split size
  double test_fraction = 0.1;   // text: the last share of the file's bytes held out for testing
  int64_t stride = 0;           // text, tokens: bytes (tokens) between training windows; 0: model.seq_len
  std::string test_path;        // tokens: a second file of token ids, the test split (empty: test_fraction)
  std::optional<TokenDType> dtype;  // tokens: the ids' type (unset: a .npy's header says, a raw .bin is uint16)
  // Whether an epoch's last, smaller batch is skipped; trained by default (its step equals one
  // device's step on those samples).
  bool drop_last = false;
};

// pipeline.defer_weight_grads: forced off (false), forced on (true), or decided for the job from
// its profile (planner/deferral.h) where the prediction says it pays ("auto", the default).
enum class DeferWeightGrads { Off, On, Auto };

struct PipelineConfig {
  int stages = 1;
  int micro_batches = 1;
  schedule::Kind schedule = schedule::Kind::GPipe;  // parsed once here (schedule/kinds.h)
  int chunks = 1;  // virtual stages per device; the kind's default when not given
  Recompute recompute = Recompute::ExceptLast;  // pipeline.recompute
  DeferWeightGrads defer_weight_grads = DeferWeightGrads::Auto;  // pipeline.defer_weight_grads
  bool cuda_graphs = false;                     // pipeline.cuda_graphs (PipelineOptions)
  // How layers are split (pipeline.balance: a method's name, job/choices.cpp, or a list).
  BalanceMethod balance_method = BalanceMethod::Uniform;
  std::vector<int> balance;            // layers per virtual stage when balance_method is List
  std::vector<int64_t> memory_limit;   // bytes per device (stage); empty or 0: no limit
  std::vector<double> speeds;          // relative device speeds; empty: all equal
  // Data parallelism: copies of the whole pipeline, each on its own shard of every batch, the
  // gradients of every stage summed across its copies (pipeline.h). Processes: the launcher
  // starts stages x data_parallel ranks, rank = stage * data_parallel + copy.
  int data_parallel = 1;
  int64_t bucket_bytes = 25 << 20;  // gradients per reduction operation
  // pipeline.devices: {"auto"} (or empty: the same), {"cpu"}, one name for every stage, or one
  // per stage (stages/device.h resolves them).
  std::vector<std::string> devices;
};

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::SGD;  // common/optimizer_kind.h
  double lr = 0.01;
  double momentum = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  LrSchedule lr_schedule = LrSchedule::Constant;  // cosine: from lr towards min_lr, progress (s - warmup) / (steps - warmup)
  int64_t warmup_steps = 0;              // linear warm-up from lr/warmup_steps to lr
  double min_lr = 0.0;                   // the end of the cosine decay
  double grad_clip = 0.0;                // largest global gradient norm (all stages together); 0: off
};

// The learning rate of optimizer step `step` (0-based) of `total` under the config's warm-up
// and schedule.
double learning_rate(const OptimizerConfig& c, int64_t step, int64_t total);

struct TrainConfig {
  int64_t steps = 100;
  uint64_t seed = 0;
  int64_t log_every = 10;
  int64_t eval_batches = 0;  // 0: the whole test split
  int64_t accumulate = 1;    // pipeline steps (batches) whose gradients make one optimizer step
  OnNonfinite on_nonfinite = OnNonfinite::Stop;  // a NaN/inf loss or gradient: stop the run or skip the update
  int64_t eval_every = 0;             // evaluate on the test split every this many steps; 0: at the end only
  int64_t checkpoint_every = 0;       // save a checkpoint every this many steps (and at the end); 0: at the end only
  std::string checkpoint_dir;         // where checkpoints go (--checkpoint-dir overrides); empty: none
  int64_t keep_checkpoints = 3;       // newest complete checkpoints kept
  // Compute dtype of the forward (autocast): fp32 | bf16 | fp16 (GPU only). Weights, gradients
  // and optimizer state stay float32 (master weights).
  Precision precision = Precision::FP32;
  // Data parallelism: each copy keeps the optimizer state of 1/data_parallel of every stage's
  // parameters (ZeRO stage 1: reduce-scatter, step the slice, all-gather).
  bool shard_optimizer = false;
  // A TensorBoard log of the run in this directory (train/tensorboard.h); empty: none.
  std::string tensorboard;
};

struct RuntimeConfig {
  // threads: one process, a thread per stage; processes: one process (rank) per stage, started
  // by a launcher (pipetrain launch, torchrun-style, mpirun, srun), over `transport`.
  RuntimeKind kind = RuntimeKind::Threads;
  // A backend of comm/backend.h; "auto" (the default for processes) is resolved when the config
  // is read: nccl between GPUs, else ucx, else gloo (local for threads).
  comm::Backend transport = comm::Backend::Local;
  // UCX: a peer that dies fails waits at once (UCX 1.13 then cannot use shared memory between
  // processes, so ranks on one host talk over tcp); off: shared memory, and a dead peer is
  // noticed at the timeout.
  bool detect_peer_failure = true;
  int intra_op_threads = 0;  // 0: cores / stages
  double timeout_s = 300;
  uint64_t max_message_bytes = uint64_t(1) << 32;
  DType dtype = DType::Float32;
  // GPU stages (docs/gpu.md): cuDNN picks the fastest convolution algorithm per shape (at the
  // cost of run-to-run equality); float32 products and convolutions may use TF32 (10 bits of
  // mantissa); deterministic kernels only (an error names an operation that has none).
  bool cudnn_benchmark = false;
  bool tf32 = false;
  bool deterministic = false;
};

struct Config {
  std::string source;                   // file name, for messages
  nlohmann::json model;                 // the `model` object, read by models::build
  std::shared_ptr<const Origins> origins;  // key path -> the override that set it
  nlohmann::json root;                  // the whole config after --set overrides (checkpoint identity)
  DataConfig data;
  PipelineConfig pipeline;
  OptimizerConfig optimizer;
  TrainConfig train;
  RuntimeConfig runtime;

  // Where a key came from, for messages: "<option:override> k=v: k" (common/option.h; the command
  // line spells it "--set k=v: k") or "<file>: k".
  std::string where(const std::string& key_path) const;
};

// Applies `key.path=value` texts to a config's JSON, recording in `origins` which override set
// which path, as option(Option::Override) and the text ("--set a.b=1" on the command line). A
// value that is not JSON is a string.
void apply_overrides(nlohmann::json& root, const std::vector<std::string>& overrides, Origins& origins);

// The config in `root` (read from `source`) with the overrides applied; ConfigError for anything
// wrong, naming where it came from.
Config parse_config(const nlohmann::json& root, const std::string& source,
                    const std::vector<std::string>& overrides = {});
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});


// The config in precision `p`, for a what-if (plan --compare, plan --auto, bench --precision):
// train.precision p, and model.frozen_dtype, where set, following it (fp32: frozen weights kept
// in float32), since frozen weights in bfloat16 compute only under bf16.
Config with_precision(const Config& c, Precision p);
// The --set texts that make a config's precision `p` as with_precision does.
std::vector<std::string> precision_overrides(const Config& c, const std::string& precision);

// Intra-op threads per stage: the configured value, or cores / stages (at least 1).
int intra_op_threads(const RuntimeConfig& runtime, int stages);

}  // namespace pipetrain::job
