#include "pipeline/trainer.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <optional>
#include <thread>

#include <torch/torch.h>

#include "comm/launcher_env.h"
#include "comm/rendezvous.h"
#include "common/error.h"
#include "common/rng.h"
#include "common/strings.h"
#include "models/layers.h"
#include "pipeline/checkpoint.h"
#include "pipeline/plan.h"

namespace pipetrain::pipeline {

using json = nlohmann::json;

models::Model build_model(const Config& c) {
  JsonReader model_reader(c.model, "model", c.source, c.origins);
  models::Model m = models::build(model_reader, c.train.seed);
  m.layers->to(c.runtime.dtype == "float64" ? torch::kDouble : torch::kFloat);
  return m;
}

Job prepare(const Config& c, bool resolve_balance) {
  Job job{c, build_model(c), {}, {}, c.runtime.dtype == "float64" ? torch::kDouble : torch::kFloat};
  const int layers = static_cast<int>(job.model.layers->size());
  const int V = c.pipeline.stages * c.pipeline.chunks;
  if (V > layers)
    throw ConfigError(
        c.where("pipeline.stages") + ": " + std::to_string(c.pipeline.stages) + " stages" +
        (c.pipeline.chunks > 1 ? " x " + std::to_string(c.pipeline.chunks) + " chunks (" + std::to_string(V) + " virtual stages)" : "") +
        " but the model has only " + std::to_string(layers) + " layers (" +
        join(models::layer_names(job.model.layers), ", ") + ")");
  if (!c.pipeline.balance.empty())
    partitioner::check(c.pipeline.balance, layers, V, c.where("pipeline.balance"));
  job.data = load_dataset(c, job.model);

  PipelineOptions& o = job.options;
  o.stages = c.pipeline.stages;
  o.micro_batches = c.pipeline.micro_batches;
  o.schedule = c.pipeline.schedule;
  o.chunks = c.pipeline.chunks;
  o.recompute = stages::parse_recompute(c.pipeline.checkpoint);
  o.intra_op_threads = intra_op_threads(c.runtime, c.pipeline.stages);
  o.timeout_s = c.runtime.timeout_s;
  o.seed = c.train.seed;
  o.transport.max_message_bytes = c.runtime.max_message_bytes;
  o.transport.backend = c.runtime.transport;
  o.transport.detect_peer_failure = c.runtime.detect_peer_failure;
  if (resolve_balance) {
    const std::string& method = c.pipeline.balance_method;
    const bool needs_profile = method == "time" || method == "memory";
    partitioner::Profile profile;
    if (needs_profile) profile = profile_job(job);
    o.balance = choose_balance(c, job.model.layers, needs_profile ? &profile : nullptr);
  } else {
    o.balance = c.pipeline.balance;
  }
  return job;
}

Batch to_model(const Job& job, Batch b) {
  if (b.input.is_floating_point()) b.input = b.input.to(job.dtype);
  return b;
}

std::string run_fingerprint(const Config& c, const std::string& run_options) {
  // train.steps as run (--steps replaces the file's value without touching root).
  return comm::config_fingerprint(c.root.dump() + " steps=" + std::to_string(c.train.steps) + " " + run_options);
}

// The thread that drives the stages (the caller) prepares each batch with as many intra-op
// threads as a stage has: with more, OpenMP's idle team workers spin after every parallel
// region and take cores from the stage threads (about 15% of the default CNN run's step on 2
// cores, where 4 stage threads share them).
namespace {
void match_stage_threads(const Job& job) { at::set_num_threads(std::max(1, job.options.intra_op_threads)); }

// An explicit runtime.intra_op_threads that gives more compute threads than cores (intra-op
// threads x the stages on this host) makes OpenMP teams time-share the cores, many times slower;
// say so rather than be silently slow. (The default, cores / stages and at least one, only
// shares cores when there are more stages than cores, which costs far less.)
void warn_if_oversubscribed(const Job& job, int stages_here) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t threads = int64_t(job.options.intra_op_threads) * stages_here;
  if (job.config.runtime.intra_op_threads > 1 && threads > cores)
    std::fprintf(stderr,
                 "pipetrain: warning: %d intra-op threads per stage x %d stage%s on this host = %lld threads on %d "
                 "cores; expect a large slowdown (runtime.intra_op_threads 0 picks cores / stages)\n",
                 job.options.intra_op_threads, stages_here, stages_here == 1 ? "" : "s",
                 static_cast<long long>(threads), cores);
}
}  // namespace

std::unique_ptr<Pipeline> make_pipeline(Job& job, const std::string& run_options) {
  const Config& c = job.config;
  if (c.runtime.kind != "processes") {
    match_stage_threads(job);
    warn_if_oversubscribed(job, c.pipeline.stages);
    // Started by a launcher but in-process: each rank runs the whole pipeline on its own.
    comm::RankInfo info;
    try {
      info = comm::rank_from_env(comm::process_environment());
    } catch (const ConfigError&) {  // not meant for us
    }
    if (info.world_size > 1 && info.rank == 0)
      std::fprintf(stderr,
                   "pipetrain: note: started as one of %d ranks (%s) with runtime.kind threads: every rank runs "
                   "all %d stages on its own; runtime.kind=processes runs one stage per rank\n",
                   info.world_size, info.launcher.c_str(), c.pipeline.stages);
    return std::make_unique<Pipeline>(job.model.layers, job.options, mean_cross_entropy);
  }
  const comm::RankInfo info = comm::rank_from_env(comm::process_environment());
  if (info.world_size != c.pipeline.stages)
    throw ConfigError(detail::concat(c.where("runtime.kind"), ": processes runs one rank per stage, but pipeline.stages is ",
                                     c.pipeline.stages, " and the launcher (", info.launcher, ") started ", info.world_size,
                                     " rank", info.world_size == 1 ? "" : "s",
                                     info.launcher == "none" ? " (start the ranks with pipetrain launch, torchrun-style variables, mpirun or srun)" : ""));
  // Each host's cores are shared by the ranks on it, not by all stages.
  if (c.runtime.intra_op_threads == 0 && info.local_world_size > 0)
    job.options.intra_op_threads = intra_op_threads(c.runtime, info.local_world_size);
  match_stage_threads(job);
  if (info.rank == 0) warn_if_oversubscribed(job, info.local_world_size > 0 ? info.local_world_size : 1);
  // UCX listens only on the interface by which this host reaches rank 0's, not on every one.
  job.options.transport.net_devices = comm::ucx_devices_towards(info.master_addr);
  const Deadline deadline = Deadline::after(c.runtime.timeout_s);
  auto endpoint = comm::make_process_transport(job.options.transport, info.rank, info.world_size,
                                               comm::store_exchange(info, run_fingerprint(c, run_options), deadline));
  return std::make_unique<Pipeline>(job.model.layers, job.options, mean_cross_entropy, std::move(endpoint));
}

namespace {

std::string clock_text(double seconds) {
  const long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

}  // namespace

void evaluate(Job& job, Pipeline& pipe, TrainResult& result) {
  const int64_t B = job.config.data.batch_size;
  int64_t batches = job.data.test_batches(B);
  if (job.config.train.eval_batches > 0) batches = std::min(batches, job.config.train.eval_batches);
  double loss_sum = 0, correct = 0;
  int64_t samples = 0, targets = 0;
  for (int64_t i = 0; i < batches; ++i) {
    Batch b = to_model(job, job.data.test_batch(i, B));
    at::Tensor out = pipe.predict(b.input);
    const int64_t n = b.target.numel();
    targets += n;
    samples += b.input.size(0);
    if (!out.defined()) continue;  // multi-process: the rank with the last stage scores
    loss_sum += mean_cross_entropy(out, b.target).item<double>() * static_cast<double>(n);
    correct += out.argmax(-1).eq(b.target).sum().item<double>();
  }
  const int last = pipe.schedule().device_of(static_cast<int>(pipe.balance().size()) - 1);
  const auto scored = pipe.from_device(last, {loss_sum, correct});
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

namespace {

// SIGINT/SIGTERM while checkpointing: finish the step, save, and stop. A second signal acts at once.
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) {
  g_stop_signal.store(sig);
  std::signal(sig, SIG_DFL);
}

struct StopSignals {
  void (*old_int)(int), (*old_term)(int);
  StopSignals() {
    g_stop_signal.store(0);
    old_int = std::signal(SIGINT, on_stop_signal);
    old_term = std::signal(SIGTERM, on_stop_signal);
    if (old_int == SIG_IGN) std::signal(SIGINT, SIG_IGN);  // a background job keeps ignoring ^C
    if (old_term == SIG_IGN) std::signal(SIGTERM, SIG_IGN);
  }
  ~StopSignals() {
    std::signal(SIGINT, old_int);
    std::signal(SIGTERM, old_term);
  }
};

}  // namespace

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
TrainResult run_training(Job& job, Pipeline& pipe, const TrainOptions& options_in);

// Runs `work` on every rank, then waits for the others (no rank leaves while another may still
// need it). Multi-process: an exception ends the pipeline, so the other ranks stop at once,
// naming this one.
template <typename Work>
TrainResult collectively(Pipeline& pipe, Work&& work) {
  try {
    TrainResult result = work();
    pipe.barrier();
    return result;
  } catch (const std::exception& e) {
    pipe.abort(e.what());
    throw;
  }
}
}  // namespace

std::string train_run_options(const TrainOptions& o) {
  return detail::concat("checkpoint_dir=", o.checkpoint_dir, " resume=", o.resume, " until_step=", o.until_step);
}

TrainResult train(Job& job, const TrainOptions& options) {
  // Ranks of a multi-process run must also agree on the options that are not in the config.
  std::unique_ptr<Pipeline> pipe = make_pipeline(job, train_run_options(options));
  return collectively(*pipe, [&] { return run_training(job, *pipe, options); });
}

TrainResult evaluate_model(Job& job) {
  std::unique_ptr<Pipeline> pipe = make_pipeline(job);
  return collectively(*pipe, [&] {
    TrainResult result;
    result.rank = pipe->rank();
    evaluate(job, *pipe, result);
    return result;
  });
}

namespace {

TrainResult run_training(Job& job, Pipeline& pipe, const TrainOptions& options_in) {
  const Config& c = job.config;
  // Multi-process: rank 0 reports progress and writes the metrics and trace files.
  const bool primary = pipe.rank() <= 0;
  TrainOptions options = options_in;
  if (!primary) {
    options.progress = false;
    options.metrics_path.clear();
    options.trace_path.clear();
  }
  pipe.set_optimizer(make_optimizer_factory(c.optimizer));

  // Checkpoints: a directory with checkpoints in it is only ever continued (--resume), never
  // overwritten by a fresh run.
  const std::string ckpt_dir = options.checkpoint_dir.empty() ? c.train.checkpoint_dir : options.checkpoint_dir;
  const std::string ckpt_where = options.checkpoint_dir.empty() ? c.where("train.checkpoint_dir") : "--checkpoint-dir";
  if (options.resume && ckpt_dir.empty())
    throw ConfigError("--resume: no checkpoint directory (give --checkpoint-dir or train.checkpoint_dir)");
  if (c.train.checkpoint_every > 0 && ckpt_dir.empty())
    throw ConfigError(c.where("train.checkpoint_every") + ": checkpoints every " +
                      std::to_string(c.train.checkpoint_every) + " steps need a directory (--checkpoint-dir or train.checkpoint_dir)");
  if (options.until_step > 0 && ckpt_dir.empty())
    throw ConfigError("--until-step: stops the run with a checkpoint to resume from, which needs a directory "
                      "(--checkpoint-dir or train.checkpoint_dir)");
  // A directory that cannot take a checkpoint is found now, not after the training time is spent.
  if (!ckpt_dir.empty()) check_checkpoint_dir(ckpt_dir, ckpt_where);
  TrainResult result;
  result.rank = pipe.rank();
  const int64_t steps = c.train.steps;
  if (!ckpt_dir.empty()) {
    const std::string latest = latest_checkpoint(ckpt_dir);
    if (options.resume) {
      if (latest.empty()) throw ConfigError("--resume: " + ckpt_dir + " holds no complete checkpoint");
      const CheckpointState st = load_checkpoint(latest, c, pipe);
      if (st.step > steps)
        throw ConfigError(detail::concat("--resume: the checkpoint ", latest, " is at step ", st.step,
                                         " but train.steps is ", steps));
      result.first_step = st.step;
      result.checkpoint = latest;
      if (options.progress)
        std::fprintf(stderr, "pipetrain: resuming from %s (step %lld of %lld, written with %d stages)\n", latest.c_str(),
                     static_cast<long long>(st.step), static_cast<long long>(steps), st.stages);
    } else if (!latest.empty()) {
      throw ConfigError(ckpt_where + ": " + ckpt_dir + " already holds checkpoints (latest " + latest +
                        "); pass --resume to continue that run, or choose another directory");
    }
  }
  if (options.until_step < 0 || (options.until_step > 0 && options.until_step <= result.first_step))
    throw ConfigError(detail::concat("--until-step: ", options.until_step, " is not after the first step to run (",
                                     result.first_step + 1, ")"));
  std::optional<StopSignals> signals;
  if (!ckpt_dir.empty()) signals.emplace();

  std::ofstream metrics;
  if (!options.metrics_path.empty()) {
    // A resumed run appends to the metrics of the run it continues.
    metrics.open(options.metrics_path, std::ios::out | (options.resume ? std::ios::app : std::ios::trunc));
    if (!metrics) throw ConfigError("--metrics " + options.metrics_path + ": cannot open for writing");
  }
  std::ofstream trace_file;
  if (!options.trace_path.empty()) {
    trace_file.open(options.trace_path, std::ios::out | std::ios::trunc);
    if (!trace_file) throw ConfigError("--trace " + options.trace_path + ": cannot open for writing");
  }
  const int64_t first_traced = c.train.steps > 1 ? 1 : 0;
  schedule::TraceTimeline traced{detail::concat("measured: ", c.pipeline.schedule, ", ", pipe.stages(),
                                                " stages, ", job.options.micro_batches, " micro-batches"),
                                 std::vector<std::vector<schedule::TraceSpan>>(pipe.stages())};
  double trace_origin = -1;
  const bool tty = isatty(STDERR_FILENO);
  const int64_t B = c.data.batch_size, A = c.train.accumulate;
  pipe.set_grad_clip(c.optimizer.grad_clip);
  pipe.track_grad_norm(!options.metrics_path.empty());
  pipe.check_finite_grads(true);
  if (primary)
    std::fprintf(stderr, "pipetrain: %s on %s, %d stages %s, %d micro-batches, checkpoint %s, %d intra-op threads per stage%s\n",
                 c.model.value("family", "?").c_str(), job.data.name.c_str(), pipe.stages(),
                 partitioner::to_string(pipe.balance()).c_str(), job.options.micro_batches,
                 c.pipeline.checkpoint.c_str(), job.options.intra_op_threads,
                 pipe.rank() >= 0 ? detail::concat(", one process per stage over ", c.runtime.transport).c_str() : "");

  const auto start = Clock::now();
  auto window_start = start;
  int64_t window_samples = 0;
  double rate = 0;
  const int64_t first = result.first_step;
  const int64_t last_step = options.until_step > 0 ? std::min(steps, options.until_step) : steps;
  auto save = [&](int64_t done) {
    result.checkpoint = save_checkpoint(ckpt_dir, c, pipe, done, done * A, static_cast<int>(c.train.keep_checkpoints));
    if (options.progress)
      std::fprintf(stderr, "%spipetrain: checkpoint %s\n", tty ? "\n" : "", result.checkpoint.c_str());
  };
  for (int64_t s = first; s < last_step; ++s) {
    // One optimizer step over `accumulate` batches; each batch's loss weighs 1/accumulate.
    const auto t0 = Clock::now();
    double loss = 0;
    for (int64_t a = 0; a < A; ++a) {
      Batch b = to_model(job, job.data.train_batch(s * A + a, B, c.train.seed));
      loss += pipe.forward_backward(b.input, b.target, /*accumulate=*/a > 0, 1.0 / static_cast<double>(A));
    }
    const double lr = learning_rate(c.optimizer, s, steps);
    // A non-finite loss or gradient stops the run or skips the update (train.on_nonfinite);
    // either way no parameter changes.
    std::string nonfinite;
    if (!std::isfinite(loss)) {
      nonfinite = detail::concat("the loss is ", loss, " (computed by stage ", pipe.stages() - 1, ", the last)");
    } else {
      pipe.set_learning_rate(lr);
      try {
        pipe.step_optimizer();
      } catch (const NonFiniteGradient& e) {
        nonfinite = e.what();
      }
    }
    if (!nonfinite.empty()) {
      if (c.train.on_nonfinite == "stop")
        throw Error(detail::concat("step ", s + 1, ": ", nonfinite, "; stopping (lower optimizer.lr, set optimizer.grad_clip, or train.on_nonfinite=skip)"));
      ++result.skipped_steps;
      std::fprintf(stderr, "%spipetrain: step %lld: %s; update skipped\n", tty ? "\n" : "",
                   static_cast<long long>(s + 1), nonfinite.c_str());
    }
    const auto t1 = Clock::now();
    const double step_s = std::chrono::duration<double>(t1 - t0).count();
    const double elapsed = std::chrono::duration<double>(t1 - start).count();
    result.losses.push_back(loss);
    if (trace_file.is_open() && s >= first_traced && s < first_traced + options.trace_steps) {
      if (trace_origin < 0) trace_origin = pipe.last_trace().start;
      auto tl = timeline(pipe.last_trace(), trace_origin);
      for (size_t r = 0; r < tl.size(); ++r)
        traced.spans[r].insert(traced.spans[r].end(), tl[r].begin(), tl[r].end());
      if (s + 1 == std::min(steps, first_traced + options.trace_steps)) {
        schedule::write_chrome_trace(trace_file, {traced});
        trace_file.close();
        if (!trace_file) throw Error("--trace " + options.trace_path + ": write failed");
      }
    }
    window_samples += A * B;
    // Every rank stops after the same step, whichever of them saw the signal.
    const bool stopping = signals && pipe.any_rank(g_stop_signal.load() != 0);
    const double window_s = std::chrono::duration<double>(t1 - window_start).count();
    if (window_s >= 1.0 || rate == 0) {
      rate = window_samples / window_s;
      window_start = t1;
      window_samples = 0;
    }
    if (metrics.is_open()) {
      metrics << nlohmann::json{{"step", s + 1},          {"loss", loss},
                                {"samples_per_s", A * B / step_s}, {"step_time_s", step_s},
                                {"time_s", elapsed},       {"lr", lr},
                                {"grad_norm", pipe.last_grad_norm()},
                                {"stage_busy_ms", stage_busy_ms(pipe.last_trace())},
                                {"skipped", !nonfinite.empty()}}
                     .dump()
              << "\n" << std::flush;
    }
    const bool last = s + 1 == last_step || stopping;
    if (options.progress && (tty || (s + 1) % c.train.log_every == 0 || last)) {
      const double eta = rate > 0 ? (last_step - s - 1) * A * B / rate : 0;
      std::fprintf(stderr, "%sstep %lld/%lld | loss %.4f | %.0f samples/s | %s elapsed | %s left%s",
                   tty ? "\r" : "", static_cast<long long>(s + 1), static_cast<long long>(steps), loss,
                   rate, clock_text(elapsed).c_str(), clock_text(eta).c_str(), tty ? "   " : "\n");
      if (tty && last) std::fprintf(stderr, "\n");
    }
    if (c.train.eval_every > 0 && (s + 1) % c.train.eval_every == 0 && s + 1 < steps) {
      TrainResult e;
      evaluate(job, pipe, e);
      if (options.progress)
        std::fprintf(stderr, "%sstep %lld: %s\n", tty ? "\n" : "", static_cast<long long>(s + 1), describe_test(e).c_str());
      if (metrics.is_open()) {
        json j = test_results_json(e);
        j["event"] = "eval";
        j["step"] = s + 1;
        metrics << j.dump() << "\n" << std::flush;
      }
    }
    if (!ckpt_dir.empty() && (stopping || s + 1 == last_step ||
                              (c.train.checkpoint_every > 0 && (s + 1) % c.train.checkpoint_every == 0)))
      save(s + 1);
    if (stopping) {
      result.signal = g_stop_signal.load() ? g_stop_signal.load() : SIGTERM;  // a peer's signal
      result.stopped_at = s + 1;
      break;
    }
  }
  if (result.stopped_at == 0 && last_step < steps) result.stopped_at = last_step;
  const int64_t ran = static_cast<int64_t>(result.losses.size());
  const double total = std::chrono::duration<double>(Clock::now() - start).count();
  result.samples_per_s = total > 0 ? ran * A * B / total : 0;
  if (result.stopped_at > 0) {
    if (metrics.is_open()) metrics.flush();
    if (options.progress)
      std::fprintf(stderr, "pipetrain: stopped at step %lld of %lld%s; continue with --resume\n",
                   static_cast<long long>(result.stopped_at), static_cast<long long>(steps),
                   result.signal ? (result.signal == SIGINT ? " (SIGINT)" : " (SIGTERM)") : "");
    return result;
  }
  if (options.progress)
    std::fprintf(stderr, "pipetrain: %lld steps in %s, %.1f samples/s, final loss %.4f%s\n",
                 static_cast<long long>(ran), clock_text(total).c_str(), result.samples_per_s,
                 result.losses.empty() ? 0.0 : result.losses.back(),
                 result.skipped_steps ? detail::concat(", ", result.skipped_steps, " updates skipped").c_str() : "");
  evaluate(job, pipe, result);
  if (metrics && result.test_samples > 0) {
    json j = test_results_json(result);
    j["event"] = "test";
    j["step"] = steps;
    metrics << j.dump() << "\n";
  }
  return result;
}

}  // namespace

SingleDevice::SingleDevice(torch::nn::Sequential model, stages::LossFn loss, OptimizerFactory optimizer,
                           uint64_t seed)
    : model_(std::move(model)), loss_(std::move(loss)), optimizer_(optimizer(model_->parameters())), seed_(seed) {}

double SingleDevice::train_step(const at::Tensor& input, const at::Tensor& target) {
  optimizer_->zero_grad();
  RngContextGuard rng(RngContext{seed_, step_++, 0});
  at::Tensor loss = loss_(model_->forward(input), target);
  models::commit_batch_norm(*model_);  // the whole batch in one forward, as torch's BatchNorm
  loss.backward();
  optimizer_->step();
  return loss.item<double>();
}

}  // namespace pipetrain::pipeline
