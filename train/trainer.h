// Training a job: the training loop with its checkpoints, metrics and controls, and evaluation.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "job/job.h"
#include "job/runtime.h"

namespace pipetrain::train {

struct TrainResult {
  std::vector<double> losses;
  int64_t skipped_steps = 0;  // updates skipped for a non-finite loss or gradient (train.on_nonfinite=skip)
  double samples_per_s = 0;  // over the whole run
  double seconds = 0;        // the training loop's time in this run
  int64_t test_samples = 0;  // 0: no test split
  double test_loss = 0, test_accuracy = 0;
  bool language_model = false;  // token targets: report perplexity exp(test_loss)
  std::string baseline_name;    // e.g. "unigram" (text data); empty: none
  double baseline_loss = 0;     // the baseline's loss on the whole test split
  int64_t first_step = 0;       // steps already done when this run started (resumed runs)
  int64_t stopped_at = 0;       // the step the run stopped at before train.steps (until_step, a stop request); 0: none
  // What stop_requested returned when it stopped the run (the command line: the signal), -1 when
  // another rank was asked; 0: not stopped on request.
  int stop_request = 0;
  std::string checkpoint;       // the last checkpoint saved; empty: none
  int rank = -1;                // runtime.kind processes: this process's rank; -1: in-process
};

// One finished step, as observers see it.
struct StepReport {
  int64_t step = 0;       // 1-based
  int64_t steps = 0;      // train.steps
  int64_t last_step = 0;  // where this run ends (an earlier until_step)
  double loss = 0, lr = 0, grad_norm = 0;
  double loss_scale = 1;  // fp16: the scale of the next step; 1 otherwise
  double step_s = 0, elapsed_s = 0;  // this step; since this run started
  int64_t samples = 0;               // in this step (batch x accumulate)
  std::vector<double> stage_busy_ms;
  // Per device, with a TensorBoard log: the step's peak of the tensors its stage allocated plus
  // its parameters and optimizer state (every rank's, gathered); empty otherwise.
  std::vector<int64_t> device_peak_bytes;
  std::string skipped;                  // why the update was skipped (a non-finite value); empty: applied
  const pipeline::StepTrace* trace = nullptr;     // the step's measured spans
};

// What a training run reports as it goes. The terminal (apps/) draws the progress line from it,
// and the metrics and trace files are written through it. Multi-process: rank 0's observers
// hear about the whole run; the other ranks' hear nothing but notes.
class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void note(const std::string& text) {}  // "warning: ..." or "note: ..." about the set-up
  // `description`: model, data, layout and threads; `resumed_from`: a checkpoint, or "".
  virtual void started(const std::string& description, const std::string& resumed_from, int64_t first_step,
                       int64_t steps) {}
  virtual void stepped(const StepReport& report) {}
  virtual void evaluated(int64_t step, const TrainResult& result) {}  // every train.eval_every steps
  virtual void saved(const std::string& checkpoint) {}
  // The loop is over: at train.steps, or stopped early (result.stopped_at, result.stop_request).
  virtual void ended(const TrainResult& result) {}
  virtual void tested(const TrainResult& result) {}  // the final evaluation on the test split
  /// The run was started again after a failure (pipetrain launch --max-restarts): the attempt
  /// (1 for the first restart) and why the one before ended. Before started().
  virtual void restarted(int attempt, const std::string& cause) {}
};

struct TrainOptions {
  std::string metrics_path;  // JSON lines, one per step; empty: none
  std::string trace_path;    // Chrome trace of the measured spans of `trace_steps` steps; empty: none
  std::string tensorboard_dir;  // TensorBoard event file here (train/tensorboard.h); empty: train.tensorboard
  int trace_steps = 1;       // traced steps start at the second step (the first warms up), if there is one
  std::string checkpoint_dir;  // overrides train.checkpoint_dir
  bool resume = false;         // continue from the latest complete checkpoint in the checkpoint directory
  int64_t until_step = 0;      // stop after this step (saving a checkpoint), as if interrupted; 0: run to the end
  std::vector<TrainObserver*> observers;
  // Polled after every step: nonzero asks the run to stop there, with a checkpoint (the command
  // line returns the signal it caught), 0 goes on. Multi-process: every rank stops after the same
  // step, whichever rank was asked.
  std::function<int()> stop_requested;
  // A restart of a failed run (pipetrain launch --max-restarts): which (1 for the first; 0: this
  // is no restart) and why the run before ended; observers hear of it, the metrics record it.
  int restart = 0;
  std::string restart_cause;
};

TrainResult train(job::Job& job, const TrainOptions& options);
// What the ranks of a multi-process train() must agree on beyond the config (train() passes it
// to make_pipeline).
std::string train_run_options(const TrainOptions& options);

// Mean loss and accuracy of `predict` over the test split (up to train.eval_batches batches).
void evaluate(job::Job& job, pipeline::Pipeline& pipe, TrainResult& result);
// evaluate() of the job's model as it is (e.g. loaded from a checkpoint) through the job's
// pipeline (make_pipeline: with runtime.kind processes every rank calls it; `rank` says which).
TrainResult evaluate_model(job::Job& job, const job::NoteSink& note = {});

// One line of test results: "test accuracy A, test loss L[, perplexity P] on N samples".
std::string describe_test(const TrainResult& result);
// The same as JSON: test_loss, test_accuracy, test_samples, test_perplexity (language models),
// baseline and baseline_loss (where the data set has one).
nlohmann::json test_results_json(const TrainResult& result);

}  // namespace pipetrain::train
