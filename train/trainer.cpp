#include "train/trainer.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include <torch/torch.h>

#include "common/error.h"
#include "common/option.h"
#include "common/strings.h"
#include "checkpoint/checkpoint.h"
#include "planner/deferral.h"
#include "train/tensorboard.h"
#include "profiler/profile.h"

namespace pipetrain::job {}
namespace pipetrain::checkpoint {}
namespace pipetrain::planner {}

namespace pipetrain::train {

using namespace ::pipetrain::job;         // configs and jobs
using namespace ::pipetrain::checkpoint;  // checkpoints
using namespace ::pipetrain::planner;     // plans and predictions

using json = nlohmann::json;

void evaluate(Job& job, Pipeline& pipe, TrainResult& result) {
  const int64_t B = job.config.data.batch_size;
  int64_t batches = job.data.test_batches(B);
  if (job.config.train.eval_batches > 0) batches = std::min(batches, job.config.train.eval_batches);
  double loss_sum = 0, correct = 0;
  int64_t samples = 0, targets = 0;
  for (int64_t i = 0; i < batches; ++i) {
    Batch b = to_model(job, job.data.test_batch(i, B));
    at::Tensor out = pipe.predict(b.input);
    if (out.defined() && !out.is_cpu()) out = out.cpu();  // the last stage's device
    const int64_t n = b.target.numel();
    targets += n;
    samples += b.input.size(0);
    if (!out.defined()) continue;  // multi-process: the rank with the last stage scores
    loss_sum += mean_cross_entropy(out, b.target).item<double>() * static_cast<double>(n);
    correct += out.argmax(-1).eq(b.target).sum().item<double>();
  }
  const int last = pipe.schedule().device_of(static_cast<int>(pipe.balance().size()) - 1);
  const auto scored = pipe.collectives().broadcast({loss_sum, correct}, pipe.rank_of(last), "the test results");
  loss_sum = scored.at(0);
  correct = scored.at(1);
  result.test_samples = samples;
  result.language_model = job.data.tokens;
  result.baseline_name = job.data.baseline_name;
  result.baseline_loss = job.data.baseline_loss;
  if (targets > 0) {
    result.test_loss = loss_sum / static_cast<double>(targets);
    result.test_accuracy = correct / static_cast<double>(targets);
  }
}

std::string describe_test(const TrainResult& r) {
  char ppl[48] = "";
  if (r.language_model) std::snprintf(ppl, sizeof ppl, ", perplexity %.2f", std::exp(r.test_loss));
  char buf[256];
  std::snprintf(buf, sizeof buf, "test accuracy %.4f, test loss %.4f%s on %lld samples", r.test_accuracy, r.test_loss,
                ppl, static_cast<long long>(r.test_samples));
  std::string line = buf;
  if (!r.baseline_name.empty()) {
    std::snprintf(buf, sizeof buf, "; %s baseline %.4f (perplexity %.2f)", r.baseline_name.c_str(), r.baseline_loss,
                  std::exp(r.baseline_loss));
    line += buf;
  }
  return line;
}

json test_results_json(const TrainResult& r) {
  json j{{"test_loss", r.test_loss}, {"test_accuracy", r.test_accuracy}, {"test_samples", r.test_samples}};
  if (r.language_model) j["test_perplexity"] = std::exp(r.test_loss);
  if (!r.baseline_name.empty()) {
    j["baseline"] = r.baseline_name;
    j["baseline_loss"] = r.baseline_loss;
  }
  return j;
}

namespace {

// Runs `work` on every rank, then waits for the others (no rank leaves while another may still
// need it). Multi-process: an exception ends the pipeline, so the other ranks stop at once,
// naming this one.
template <typename Work>
TrainResult collectively(Pipeline& pipe, Work&& work) {
  try {
    TrainResult result = work();
    pipe.collectives().barrier("the end of the run");
    return result;
  } catch (const std::exception& e) {
    pipe.collectives().abort(e.what());
    throw;
  }
}
// The metrics file: one JSON object per step, per evaluation and for the final test. A resumed
// run appends to the file of the run it continues.
class MetricsFile final : public TrainObserver {
 public:
  MetricsFile(const std::string& path, bool append, const std::string& name) : path_(path), name_(name) {
    out_.open(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
    if (!out_) throw ConfigError(name + " " + path + ": cannot open for writing");
  }
  void stepped(const StepReport& r) override {
    json line{{"step", r.step}, {"loss", r.loss}, {"samples_per_s", r.samples / r.step_s}, {"step_time_s", r.step_s},
              {"time_s", r.elapsed_s}, {"lr", r.lr}, {"grad_norm", r.grad_norm}, {"stage_busy_ms", r.stage_busy_ms},
              {"skipped", !r.skipped.empty()}, {"loss_scale", r.loss_scale}};
    if (!r.device_peak_bytes.empty()) line["device_peak_bytes"] = r.device_peak_bytes;
    write(line);
  }
  void evaluated(int64_t step, const TrainResult& result) override { write(event("eval", step, result)); }
  void restarted(int attempt, const std::string& cause) override {
    write({{"event", "restart"}, {"restart", attempt}, {"cause", cause}});
  }
  void tested(const TrainResult& result) override {
    if (result.test_samples > 0) write(event("test", result.first_step + static_cast<int64_t>(result.losses.size()), result));
  }

 private:
  static json event(const char* what, int64_t step, const TrainResult& result) {
    json j = test_results_json(result);
    j["event"] = what;
    j["step"] = step;
    return j;
  }
  // Every line is flushed and checked: a full disk ends the run with the reason instead of
  // cutting the file mid-line and going on (the lines before stay whole).
  void write(const json& j) {
    errno = 0;
    out_ << j.dump() << "\n" << std::flush;
    if (!out_)
      throw IoError(detail::concat(name_, " ", path_, ": write failed (", errno ? std::strerror(errno) : "stream error", ")"));
  }
  std::string path_, name_;
  std::ofstream out_;
};

// The Chrome trace of the measured spans of `count` steps from the second one (the first warms
// up), written once the last of them is done.
class TraceFile final : public TrainObserver {
 public:
  TraceFile(const std::string& path, int count, const std::string& title, int stages, int64_t steps,
            const std::string& name)
      : path_(path), name_(name), first_(steps > 1 ? 1 : 0), count_(count), steps_(steps),
        traced_{title, std::vector<std::vector<schedule::TraceSpan>>(stages), "", {}} {
    out_.open(path, std::ios::out | std::ios::trunc);
    if (!out_) throw ConfigError(name + " " + path + ": cannot open for writing");
  }
  void stepped(const StepReport& r) override {
    const int64_t s = r.step - 1;
    if (!out_.is_open() || s < first_ || s >= first_ + count_ || !r.trace) return;
    if (origin_ < 0) origin_ = r.trace->start;
    auto tl = pipeline::timeline(*r.trace, origin_);
    for (size_t d = 0; d < tl.size(); ++d) traced_.spans[d].insert(traced_.spans[d].end(), tl[d].begin(), tl[d].end());
    if (r.step == std::min(steps_, first_ + count_)) {
      schedule::write_chrome_trace(out_, {traced_});
      out_.close();
      if (!out_) throw Error(name_ + " " + path_ + ": write failed");
    }
  }

 private:
  std::string path_, name_;
  int64_t first_;
  int count_;
  int64_t steps_;
  schedule::TraceTimeline traced_;
  double origin_ = -1;
  std::ofstream out_;
};

// The checkpoint directory of a run and where it came from; resuming loads the latest
// checkpoint in it. A directory that holds checkpoints is only ever continued, never
// overwritten by a fresh run; one that cannot take a checkpoint is found before training.
struct Checkpoints {
  std::string dir, where;
  std::string resumed_from;  // the checkpoint loaded; "" for a fresh run
  int64_t first_step = 0;    // steps done when this run starts
  std::string note;          // said once the run starts (a resume in another precision)
};

Checkpoints open_checkpoints(const Config& c, const TrainOptions& o, Pipeline& pipe) {
  Checkpoints k;
  k.dir = o.checkpoint_dir.empty() ? c.train.checkpoint_dir : o.checkpoint_dir;
  k.where = o.checkpoint_dir.empty() ? c.where("train.checkpoint_dir") : option(Option::CheckpointDir);
  const std::string either = detail::concat("(", option(Option::CheckpointDir), " or train.checkpoint_dir)");
  if (o.resume && k.dir.empty()) throw ConfigError(option(Option::Resume) + ": no checkpoint directory " + either);
  if (c.train.checkpoint_every > 0 && k.dir.empty())
    throw ConfigError(detail::concat(c.where("train.checkpoint_every"), ": checkpoints every ", c.train.checkpoint_every,
                                     " steps need a directory ", either));
  if (o.until_step > 0 && k.dir.empty())
    throw ConfigError(option(Option::UntilStep) + ": stops the run with a checkpoint to resume from, which needs a directory " + either);
  if (k.dir.empty()) return k;
  check_checkpoint_dir(k.dir, k.where);
  const std::string latest = latest_checkpoint(k.dir);
  if (o.resume && latest.empty()) {
    // Killed before or during its first save: a restart that always passes resume starts afresh.
    k.note = detail::concat("note: ", option(Option::Resume), ": ", k.dir, " holds no complete checkpoint yet; starting afresh");
  } else if (o.resume) {
    const CheckpointState st = load_checkpoint(latest, c, pipe);
    if (st.step > c.train.steps)
      throw ConfigError(detail::concat(option(Option::Resume), ": the checkpoint ", latest, " is at step ", st.step,
                                       " but train.steps is ", c.train.steps));
    k.first_step = st.step;
    k.resumed_from = latest;
    const std::string saved = st.manifest.value("precision", "fp32");
    if (saved != precision_name(c.train.precision))
      k.note = detail::concat("note: resuming ", latest, ", trained in ", saved, ", in ", precision_name(c.train.precision),
                              " (train.precision); the float32 weights and optimizer state carry over as they are");
  } else if (!latest.empty()) {
    throw ConfigError(detail::concat(k.where, ": ", k.dir, " already holds checkpoints (latest ", latest, "); pass ",
                                     option(Option::Resume), " to continue that run, or choose another directory"));
  }
  return k;
}

// The samples of optimizer step s: its train.accumulate batches (an epoch's last may be short).
int64_t step_samples(const Job& job, int64_t s) {
  const Config& c = job.config;
  int64_t n = 0;
  for (int64_t a = 0; a < c.train.accumulate; ++a)
    n += job.data.train_batch_size(s * c.train.accumulate + a, c.data.batch_size, c.data.drop_last);
  return n;
}

// One optimizer step over train.accumulate batches, each batch's loss weighing its share of the
// step's samples (1/accumulate when the batches are full), so that the step is one device's on
// all of them. A non-finite loss or gradient skips the update or stops the run
// (train.on_nonfinite); either way no parameter changes. Returns the loss; `skipped` says why an
// update was skipped.
double run_step(Job& job, Pipeline& pipe, int64_t s, double lr, std::string& skipped) {
  const Config& c = job.config;
  const int64_t A = c.train.accumulate, B = c.data.batch_size;
  const double total = static_cast<double>(step_samples(job, s));
  double loss = 0;
  for (int64_t a = 0; a < A; ++a) {
    Batch b = to_model(job, job.data.train_batch(s * A + a, B, c.train.seed, c.data.drop_last));
    pipe.sync_gradients(a == A - 1);  // data parallelism: reduce once, after the last batch
    // n / total: for full batches exactly 1 / A (division rounds the same real number).
    loss += pipe.forward_backward(b.input, b.target, /*accumulate=*/a > 0, static_cast<double>(b.input.size(0)) / total);
  }
  skipped.clear();
  if (!std::isfinite(loss)) {
    skipped = detail::concat("the loss is ", loss, " (computed by stage ", pipe.stages() - 1, ", the last)");
  } else {
    pipe.optimizers().set_learning_rate(lr);
    try {
      pipe.optimizers().step();
    } catch (const NonFiniteGradient& e) {
      skipped = e.what();
    }
    // fp16: an overflow is loss scaling at work (the scale backs off), not a diverging run.
    if (pipe.optimizers().last_step_skipped()) {
      skipped = detail::concat("a float16 gradient overflowed; the loss scale backs off to ", pipe.optimizers().loss_scale());
      return loss;
    }
  }
  if (!skipped.empty() && c.train.on_nonfinite == job::OnNonfinite::Stop)
    throw Error(detail::concat("step ", s + 1, ": ", skipped,
                               "; stopping (lower optimizer.lr, set optimizer.grad_clip, or train.on_nonfinite=skip)"));
  return loss;
}

std::string describe_run(const Job& job, const Pipeline& pipe) {
  const Config& c = job.config;
  return detail::concat(c.model.value("family", "?"), " on ", job.data.name, ", ", pipe.stages(), " stages ",
                        partitioner::to_string(pipe.balance()), ", ", job.options.micro_batches,
                        " micro-batches, recompute ", recompute_name(c.pipeline.recompute),
                        planner::deferral_words(job.options.defer_weight_grads, job.deferral), ", ",
                        job.options.intra_op_threads, " intra-op threads per stage",
                        c.train.precision != Precision::FP32 ? detail::concat(", ", precision_name(c.train.precision)) : "",
                        pipe.rank() >= 0 ? std::string(", one process per stage over ") + comm::name(c.runtime.transport) : "");
}

TrainResult run_training(Job& job, Pipeline& pipe, const TrainOptions& options) {
  const Config& c = job.config;
  pipe.optimizers().set(make_optimizer_factory(c.optimizer));
  TrainResult result;
  result.rank = pipe.rank();
  const Checkpoints ckpt = open_checkpoints(c, options, pipe);
  result.first_step = ckpt.first_step;
  result.checkpoint = ckpt.resumed_from;
  const int64_t steps = c.train.steps, first = ckpt.first_step;
  if (options.until_step < 0 || (options.until_step > 0 && options.until_step <= first))
    throw ConfigError(detail::concat(option(Option::UntilStep), ": ", options.until_step,
                                     " is not after the first step to run (", first + 1, ")"));
  const int64_t last_step = options.until_step > 0 ? std::min(steps, options.until_step) : steps;
  // A stop asked for while the checkpoint loaded (SIGTERM during a long load) ends the run
  // before its first step: the checkpoint just loaded is the latest, nothing to save.
  if (!ckpt.resumed_from.empty()) {
    const int asked = options.stop_requested ? options.stop_requested() : 0;
    if (pipe.collectives().any(asked != 0, "the stop flags")) {
      result.stop_request = asked ? asked : -1;
      result.stopped_at = first;
      return result;
    }
  }

  // Multi-process: rank 0 reports and writes the files.
  std::vector<TrainObserver*> observers;
  std::unique_ptr<MetricsFile> metrics;
  std::unique_ptr<TraceFile> trace;
  if (pipe.rank() <= 0) {
    if (!options.metrics_path.empty())
      metrics = std::make_unique<MetricsFile>(options.metrics_path, options.resume, option(Option::Metrics));
    if (!options.trace_path.empty())
      trace = std::make_unique<TraceFile>(options.trace_path, options.trace_steps,
                                          detail::concat("measured: ", c.pipeline.schedule, ", ", pipe.stages(),
                                                         " stages, ", job.options.micro_batches, " micro-batches"),
                                          pipe.stages(), steps, option(Option::Trace));
    observers = options.observers;
    if (metrics) observers.push_back(metrics.get());
    if (trace) observers.push_back(trace.get());
  }
  // TensorBoard: rank 0 writes; every rank counts its devices' memory (a counting allocator,
  // each stage's worker into its own account) and the ranks gather it each step.
  const std::string tensorboard = !options.tensorboard_dir.empty() ? options.tensorboard_dir : c.train.tensorboard;
  std::unique_ptr<TensorBoardLog> board;
  std::unique_ptr<profiler::MemoryCounter> memory;
  if (!tensorboard.empty()) {
    if (pipe.rank() <= 0) {
      try {
        board = std::make_unique<TensorBoardLog>(tensorboard);
      } catch (const ConfigError& e) {
        throw ConfigError((options.tensorboard_dir.empty() ? c.where("train.tensorboard") : option(Option::TensorBoard)) + ": " + e.what());
      }
      observers.push_back(board.get());
    }
    memory = std::make_unique<profiler::MemoryCounter>();
  }
  const auto tell = [&](auto&& event) {
    for (TrainObserver* o : observers) event(*o);
  };
  pipe.optimizers().set_grad_clip(c.optimizer.grad_clip);
  pipe.optimizers().track_grad_norm(metrics != nullptr);
  pipe.optimizers().check_finite_grads(true);
  if (options.restart > 0) tell([&](TrainObserver& o) { o.restarted(options.restart, options.restart_cause); });
  if (!ckpt.note.empty()) tell([&](TrainObserver& o) { o.note(ckpt.note); });
  tell([&](TrainObserver& o) { o.started(describe_run(job, pipe), ckpt.resumed_from, first, steps); });

  // GPU stages report their allocator's peak every step (cheap); CPU stages only with a counter.
  const bool gpu_stages = job.devices.any_cuda();
  const auto start = Clock::now();
  int64_t trained = 0;  // samples
  bool told_fewer = false;
  for (int64_t s = first; s < last_step; ++s) {
    const auto t0 = Clock::now();
    StepReport r;
    r.lr = learning_rate(c.optimizer, s, steps);
    // What each device holds before the step (parameters, optimizer state); the counter adds what
    // the step allocates, optimizer state made in it included.
    std::vector<int64_t> held_before;
    if (memory)
      for (int d = 0; d < pipe.stages(); ++d) held_before.push_back(pipe.is_local(d) ? held_bytes(pipe, d) : 0);
    r.loss = run_step(job, pipe, s, r.lr, r.skipped);
    if (!r.skipped.empty()) ++result.skipped_steps;
    result.losses.push_back(r.loss);
    const auto t1 = Clock::now();
    r.step = s + 1;
    r.steps = steps;
    r.last_step = last_step;
    r.grad_norm = pipe.optimizers().last_grad_norm();
    r.loss_scale = pipe.optimizers().loss_scale();
    r.step_s = std::chrono::duration<double>(t1 - t0).count();
    r.elapsed_s = std::chrono::duration<double>(t1 - start).count();
    r.samples = step_samples(job, s);
    trained += r.samples;
    if (!told_fewer && pipe.fewest_micro_batches() < job.options.micro_batches) {
      told_fewer = true;
      int64_t smallest = c.data.batch_size;
      for (int64_t a = 0; a < c.train.accumulate; ++a)
        smallest = std::min(smallest, job.data.train_batch_size(s * c.train.accumulate + a, c.data.batch_size, c.data.drop_last));
      tell([&](TrainObserver& o) {
        o.note(detail::concat("note: step ", s + 1, " trains an epoch's last batch, of ", smallest, " samples",
                              c.pipeline.data_parallel > 1 ? " over the copies" : "", ", fewer than its ",
                              job.options.micro_batches, " micro-batches need: it runs as ", pipe.fewest_micro_batches(),
                              " (said once; data.drop_last skips such batches)"));
      });
    }
    r.stage_busy_ms = pipeline::stage_busy_ms(pipe.last_trace());
    if (memory || gpu_stages) {
      // Copy 0's stage d allocates into account d (pipeline/executor.cpp); a rank runs its own
      // device. A GPU stage's peak is its CUDA allocator's.
      std::vector<double> mine(pipe.stages(), 0.0);
      for (int d = 0; d < pipe.stages(); ++d)
        if (pipe.is_local(d))
          mine[d] = static_cast<double>(
              std::max<int64_t>(memory ? memory->peak(d) + held_before[d] : 0, pipe.take_device_peak(d)));
      if (memory) memory->reset_peak();
      const auto all = pipe.collectives().all_gather(torch::tensor(mine, torch::kDouble), "the devices' peak memory");
      for (int d = 0; d < pipe.stages(); ++d)
        r.device_peak_bytes.push_back(static_cast<int64_t>(all.at(pipe.rank_of(d))[d].item<double>()));
    }
    r.trace = &pipe.last_trace();
    tell([&](TrainObserver& o) { o.stepped(r); });

    // Every rank stops after the same step, whichever of them was asked to.
    const int asked = !ckpt.dir.empty() && options.stop_requested ? options.stop_requested() : 0;
    const bool stopping = !ckpt.dir.empty() && pipe.collectives().any(asked != 0, "the stop flags");
    if (c.train.eval_every > 0 && (s + 1) % c.train.eval_every == 0 && s + 1 < steps) {
      TrainResult e;
      evaluate(job, pipe, e);
      tell([&](TrainObserver& o) { o.evaluated(s + 1, e); });
    }
    if (!ckpt.dir.empty() &&
        (stopping || s + 1 == last_step || (c.train.checkpoint_every > 0 && (s + 1) % c.train.checkpoint_every == 0))) {
      result.checkpoint = save_checkpoint(ckpt.dir, c, pipe, s + 1, (s + 1) * c.train.accumulate,
                                          static_cast<int>(c.train.keep_checkpoints));
      tell([&](TrainObserver& o) { o.saved(result.checkpoint); });
    }
    if (stopping) {
      result.stop_request = asked ? asked : -1;  // -1: another rank was asked
      result.stopped_at = s + 1;
      break;
    }
  }
  if (result.stopped_at == 0 && last_step < steps) result.stopped_at = last_step;
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.samples_per_s = result.seconds > 0 ? static_cast<double>(trained) / result.seconds : 0;
  tell([&](TrainObserver& o) { o.ended(result); });
  if (result.stopped_at > 0) return result;
  evaluate(job, pipe, result);
  tell([&](TrainObserver& o) { o.tested(result); });
  return result;
}

// Hands the runtime's notes to the observers.
NoteSink notes_to(const std::vector<TrainObserver*>& observers) {
  return [observers](const std::string& text) {
    for (TrainObserver* o : observers) o->note(text);
  };
}

}  // namespace

std::string train_run_options(const TrainOptions& o) {
  // A TensorBoard log makes every rank gather memory figures each step: all or none.
  return detail::concat("checkpoint_dir=", o.checkpoint_dir, " resume=", o.resume, " until_step=", o.until_step,
                        " tensorboard=", !o.tensorboard_dir.empty());
}

TrainResult train(Job& job, const TrainOptions& options) {
  planner::resolve_deferral(job);  // pipeline.defer_weight_grads "auto", once, before the pipeline
  // Ranks of a multi-process run must also agree on the options that are not in the config.
  std::unique_ptr<Pipeline> pipe = make_pipeline(job, train_run_options(options), notes_to(options.observers));
  return collectively(*pipe, [&] { return run_training(job, *pipe, options); });
}

TrainResult evaluate_model(Job& job, const NoteSink& note) {
  std::unique_ptr<Pipeline> pipe = make_pipeline(job, "", note);
  return collectively(*pipe, [&] {
    TrainResult result;
    result.rank = pipe->rank();
    evaluate(job, *pipe, result);
    return result;
  });
}

}  // namespace pipetrain::train
