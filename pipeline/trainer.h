// Running a config: build the model and data, train with progress and metrics, evaluate.
#pragma once

#include <string>
#include <vector>

#include "pipeline/config.h"
#include "pipeline/data.h"
#include "pipeline/pipeline.h"

namespace pipetrain::pipeline {

// Everything a config describes, built and checked.
struct Job {
  Config config;
  models::Model model;
  Dataset data;
  PipelineOptions options;
  at::ScalarType dtype;
};

// The config's model, built with torch's generator seeded by train.seed, in runtime.dtype.
models::Model build_model(const Config& config);

// Builds the model (seeded by train.seed) and the data set, checks stages and balance against
// the layer count, and (with `resolve_balance`) chooses the balance by the config's method,
// profiling the layers for `time` and `memory`; every problem is a ConfigError or DataError.
Job prepare(const Config& config, bool resolve_balance = true);

// Turns a data batch into model inputs of the job's dtype.
Batch to_model(const Job& job, Batch b);

// The job's pipeline. runtime.kind threads: every stage in this process. processes: this
// process is one rank (rank and world from the launcher's environment, comm/launcher_env.h);
// the ranks meet through the store at the master address, check that they run the same
// configuration (and `run_options`, what else they must agree on), and connect their transport
// endpoints, all within runtime.timeout_s.
std::unique_ptr<Pipeline> make_pipeline(Job& job, const std::string& run_options = "");
// The hash the ranks of a multi-process run compare at the rendezvous.
std::string run_fingerprint(const Config& config, const std::string& run_options = "");

struct TrainOptions {
  std::string metrics_path;  // JSON lines, one per step; empty: none
  bool progress = true;      // live progress line on stderr
  std::string trace_path;    // Chrome trace of the measured spans of `trace_steps` steps; empty: none
  int trace_steps = 1;       // traced steps start at the second step (the first warms up), if there is one
  std::string checkpoint_dir;  // overrides train.checkpoint_dir
  bool resume = false;         // continue from the latest complete checkpoint in the checkpoint directory
  int64_t until_step = 0;      // stop after this step (saving a checkpoint), as if interrupted; 0: run to the end
};

struct TrainResult {
  std::vector<double> losses;
  int64_t skipped_steps = 0;  // updates skipped for a non-finite loss or gradient (train.on_nonfinite=skip)
  double samples_per_s = 0;  // over the whole run
  int64_t test_samples = 0;  // 0: no test split
  double test_loss = 0, test_accuracy = 0;
  bool language_model = false;  // token targets: report perplexity exp(test_loss)
  std::string baseline_name;    // e.g. "unigram" (text data); empty: none
  double baseline_loss = 0;     // the baseline's loss on the whole test split
  int64_t first_step = 0;       // steps already done when this run started (resumed runs)
  int64_t stopped_at = 0;       // the step the run stopped at before train.steps (--until-step, a signal); 0: none
  int signal = 0;               // SIGINT or SIGTERM that stopped the run; 0: none
  std::string checkpoint;       // the last checkpoint saved; empty: none
  int rank = -1;                // runtime.kind processes: this process's rank; -1: in-process
};

TrainResult train(Job& job, const TrainOptions& options);
// What the ranks of a multi-process train() must agree on beyond the config (train() passes it
// to make_pipeline).
std::string train_run_options(const TrainOptions& options);

// Mean loss and accuracy of `predict` over the test split (up to train.eval_batches batches).
void evaluate(Job& job, Pipeline& pipe, TrainResult& result);
// evaluate() of the job's model as it is (e.g. loaded from a checkpoint) through the job's
// pipeline (make_pipeline: with runtime.kind processes every rank calls it; `rank` says which).
TrainResult evaluate_model(Job& job);

// One line of test results: "test accuracy A, test loss L[, perplexity P] on N samples".
std::string describe_test(const TrainResult& result);
// The same as JSON: test_loss, test_accuracy, test_samples, test_perplexity (language models),
// baseline and baseline_loss (where the data set has one).
nlohmann::json test_results_json(const TrainResult& result);

// The plain single-device training loop the pipeline is compared against.
class SingleDevice {
 public:
  SingleDevice(torch::nn::Sequential model, stages::LossFn loss, OptimizerFactory optimizer, uint64_t seed);
  double train_step(const at::Tensor& input, const at::Tensor& target);
  std::vector<at::Tensor> parameters() const { return model_->parameters(); }

 private:
  torch::nn::Sequential model_;
  stages::LossFn loss_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  uint64_t seed_;
  int64_t step_ = 0;
};

}  // namespace pipetrain::pipeline
