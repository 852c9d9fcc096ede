// The pipetrain command: train, eval, generate, export, plan, partition, bench.
#include <malloc.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "apps/faults.h"
#include "apps/launch.h"
#include "apps/progress.h"
#include "apps/signals.h"
#include "common/atomic_file.h"
#include "comm/transport.h"
#include "common/config.h"
#include "common/error.h"
#include "common/precision.h"
#include "common/recompute.h"
#include "common/strings.h"
#include "train/bench.h"
#include "train/checkpoint.h"
#include "train/generate.h"
#include "train/plan.h"
#include "train/whatif.h"
#include "train/autoplan.h"
#include "schedule/schedule.h"
#include "schedule/trace.h"
#include "stages/accelerator.h"
#include "train/balance.h"
#include "train/trainer.h"

namespace pt = pipetrain::train;
namespace comm = pipetrain::comm;
using pipetrain::apps::ProgressLine;
using pipetrain::apps::StopSignals;

namespace {

// `pipetrain partition`: the exact partitioner on a cost file, as JSON.
void run_partition(const std::string& path, int stages, int64_t memory_limit, const std::vector<double>& speeds) {
  namespace part = pipetrain::partitioner;
  const auto costs = part::load_costs(path);
  part::Constraints k;
  if (!speeds.empty() && static_cast<int>(speeds.size()) != stages)
    throw pipetrain::ConfigError("--speeds: " + std::to_string(speeds.size()) + " speeds for " +
                                 std::to_string(stages) + " stages");
  if (!speeds.empty() || memory_limit > 0) {
    k.devices.resize(stages);
    for (int i = 0; i < stages; ++i) {
      if (!speeds.empty()) k.devices[i].speed = speeds[i];
      k.devices[i].memory_limit = memory_limit;
    }
  }
  const part::Plan p = part::min_max(costs, stages, k);
  nlohmann::json j{{"balance", p.balance}, {"bottleneck", p.bottleneck_ms}, {"stage_ms", p.stage_ms},
                   {"stage_bytes", p.stage_bytes}};
  std::cout << j.dump() << "\n";
}

// The value of `--steps TEXT`: a whole number from 0 to 2^40 (as train.steps).
int64_t parse_steps_flag(const std::string& text) {
  constexpr int64_t kMax = int64_t(1) << 40;
  int64_t v = 0;
  bool ok = !text.empty() && text.size() <= 14;
  for (char ch : text) {
    if (ch < '0' || ch > '9') ok = false;
    if (ok) v = v * 10 + (ch - '0');
  }
  if (!ok || v > kMax)
    throw pipetrain::ConfigError(pipetrain::detail::concat("--steps ", pipetrain::printable(text, 40),
                                                          ": expected a whole number of steps from 0 to ", kMax));
  return v;
}

// An error as one printable line of bounded length, whatever bytes the input put in it.
void report(const std::string& message) {
  std::fprintf(stderr, "pipetrain: error: %s\n", pipetrain::printable(message, 600).c_str());
}

// `pipetrain --version`: this build, its libtorch, and what is compiled in and usable here.
std::string version_text() {
  const auto acc = pipetrain::stages::accelerator_info();
  std::ostringstream o;
  o << "pipetrain " << PIPETRAIN_VERSION << "\n";
  o << "libtorch " << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR << "." << TORCH_VERSION_PATCH
    << (acc.cuda ? " (CUDA " + acc.cuda_runtime + ")" : " (CPU only)") << "\n";
  if (acc.cuda) {
    o << "CUDA: compiled in, runtime " << acc.cuda_runtime << "; GPUs seen: " << acc.gpus;
    if (acc.gpus == 0) o << " (" << acc.no_gpu_reason << ")";
    o << "\n";
    o << "cuDNN: " << (acc.cudnn.empty() ? "not in this libtorch" : acc.cudnn) << "\n";
  } else {
    o << "CUDA: not compiled in; GPUs seen: 0\n";
  }
  o << "NCCL: " << (acc.nccl ? "compiled in, " + acc.nccl_version : std::string("not compiled in")) << "\n";
  const bool ucx = comm::has_transport_backend("ucx");
  o << "UCX: " << (ucx ? "compiled in, " + comm::transport_backend_version("ucx") : std::string("not compiled in"));
  return o.str();
}

}  // namespace

int main(int argc, char** argv) {
  // glibc would hand large freed tensors back to the system after every step and fault them
  // in again on the next; keeping them saves about 10% of an MLP step (README, Benchmarks).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum on 64-bit
  mallopt(M_TRIM_THRESHOLD, 1 << 30);

  CLI::App app{"pipetrain: pipeline-parallel training (GPipe) on libtorch", "pipetrain"};
  app.set_version_flag("--version", version_text);
  app.require_subcommand(1);

  std::string config_path, metrics_path;
  std::vector<std::string> overrides;
  std::string steps;
  bool quiet = false;
  auto* train = app.add_subcommand("train", "Train the model a config describes and report test accuracy");
  train->add_option("config", config_path, "JSON config file")->required();
  train->add_option("--steps", steps, "Number of training steps (instead of train.steps)");
  train->add_option("--set", overrides, "Override a config key: key.path=value (repeatable)");
  train->add_option("--metrics", metrics_path, "Write one JSON object per step to this file");
  bool train_auto = false;
  train->add_flag("--auto", train_auto, "Plan first (plan --auto on pipeline.stages devices), print the plan, train it");
  train->add_flag("--quiet", quiet, "No progress line");
  std::string trace_path;
  int trace_steps = 1;
  train->add_option("--trace", trace_path,
                    "Write the measured timeline of the second step (Chrome trace JSON, for Perfetto)");
  train->add_option("--trace-steps", trace_steps, "Steps to put in the --trace timeline")->check(CLI::PositiveNumber);
  pt::TrainOptions train_options;
  train->add_option("--tensorboard", train_options.tensorboard_dir,
                    "Write a TensorBoard log (loss, learning rate, gradient norm, samples/s, stage busy time and bubble, "
                    "peak memory per device, test results) into this directory (instead of train.tensorboard)");
  train->add_option("--checkpoint-dir", train_options.checkpoint_dir,
                    "Save checkpoints here (every train.checkpoint_every steps, at the end, and on SIGINT/SIGTERM)");
  train->add_flag("--resume", train_options.resume, "Continue from the latest complete checkpoint in the checkpoint directory");
  train->add_option("--until-step", train_options.until_step,
                    "Stop after this step with a checkpoint, as if interrupted (the schedule still spans train.steps)")
      ->check(CLI::PositiveNumber);

  std::string checkpoint_path;
  int64_t eval_batches = -1;
  bool eval_json = false;
  auto* eval = app.add_subcommand("eval", "Evaluate a checkpoint on the config's test split (forward only)");
  eval->add_option("config", config_path, "JSON config file")->required();
  eval->add_option("--checkpoint", checkpoint_path, "A checkpoint directory, or a checkpoint root (its latest)")->required();
  eval->add_option("--set", overrides, "Override a config key: key.path=value (repeatable)");
  eval->add_option("--batches", eval_batches, "Test batches to use (0: all; default train.eval_batches)")
      ->check(CLI::NonNegativeNumber);
  eval->add_flag("--json", eval_json, "Print the results as one JSON object");

  pt::GenerateOptions gen_options;
  std::string prompt;
  auto* generate = app.add_subcommand("generate", "Sample text from a byte-level language model checkpoint");
  generate->add_option("config", config_path, "JSON config file of the model")->required();
  generate->add_option("--checkpoint", checkpoint_path, "A checkpoint directory, or a checkpoint root (its latest)")->required();
  generate->add_option("--set", overrides, "Override a config key: key.path=value (repeatable)");
  generate->add_option("--prompt", prompt, "Text to continue (default: a newline)");
  generate->add_option("--bytes", gen_options.new_bytes, "Bytes to generate")->check(CLI::PositiveNumber);
  generate->add_option("--temperature", gen_options.temperature, "Sampling temperature; 0: greedy")->check(CLI::NonNegativeNumber);
  generate->add_option("--top-k", gen_options.top_k, "Sample among the k most likely bytes; 0: all")->check(CLI::NonNegativeNumber);
  generate->add_option("--seed", gen_options.seed, "Seed of the sampling");

  pipetrain::launch::LaunchOptions launch_options;
  auto* launcher = app.add_subcommand("launch", "Start N local ranks of a command, like torchrun");
  launcher->add_option("--nproc", launch_options.nproc, "Ranks to start")->required()->check(CLI::Range(1, 4096));
  launcher->add_option("--master-addr", launch_options.master_addr, "MASTER_ADDR given to the ranks");
  launcher->add_option("--master-port", launch_options.master_port, "MASTER_PORT given to the ranks (default: a free port)")
      ->check(CLI::Range(0, 65535));
  launcher->add_option("--grace", launch_options.grace_s, "Seconds the other ranks get to exit after one fails")
      ->check(CLI::NonNegativeNumber);
  launcher->add_option("command", launch_options.command, "After --: a pipetrain subcommand (train CONFIG ...) or a program")
      ->required();

  std::string export_out;
  auto* exporter = app.add_subcommand("export", "Write a checkpoint's merged weights as one torch.load-readable file");
  exporter->add_option("checkpoint", checkpoint_path, "A checkpoint directory, or a checkpoint root (its latest)")->required();
  exporter->add_option("out", export_out, "Output file (a dict of named tensors)")->required();

  pt::BenchOptions bench_options;
  auto* bench = app.add_subcommand("bench", "Time the plain single-device loop and the pipeline side by side");
  bench->add_option("config", config_path, "JSON config file")->required();
  bench->add_option("--set", overrides, "Override a config key: key.path=value (repeatable)");
  bench->add_option("--warmup", bench_options.warmup, "Untimed steps before measuring")->check(CLI::NonNegativeNumber);
  bench->add_option("--repeat", bench_options.repeat, "Timed steps (the median is reported)")->check(CLI::PositiveNumber);
  pt::SweepOptions sweep;
  std::string bench_json;
  bench->add_option("--stages", sweep.stages, "Sweep these stage counts (comma-separated)")->delimiter(',')->check(CLI::PositiveNumber);
  bench->add_option("--micro-batches", sweep.micro_batches, "Sweep these micro-batch counts")->delimiter(',')->check(CLI::PositiveNumber);
  bench->add_option("--data-parallel", sweep.data_parallel, "Sweep these data-parallel copy counts (pipeline.data_parallel)")
      ->delimiter(',')->check(CLI::PositiveNumber);
  bench->add_option("--recompute", sweep.recompute, "Sweep these recomputation modes")
      ->delimiter(',')->check(CLI::IsMember(pipetrain::recompute_modes()));
  std::string old_recompute_flag;
  bench->add_option("--checkpoint", old_recompute_flag, "Renamed --recompute")->group("");
  bench->add_option("--schedule", sweep.schedules, "Sweep these schedules")
      ->delimiter(',')->check(CLI::IsMember(pipetrain::schedule::kind_names()));
  bench->add_option("--precision", sweep.precisions, "Sweep these precisions (train.precision), e.g. fp32,bf16")
      ->delimiter(',')->check(CLI::IsMember(pipetrain::precision_names()));
  bench->add_option("--json", bench_json, "Append one JSON object per combination to this file");

  pt::PlanOptions plan_options;
  bool plan_json = false;
  std::string plan_trace, save_costs;
  auto* plan = app.add_subcommand("plan", "Profile the layers, partition them and predict the step of a config");
  plan->add_option("config", config_path, "JSON config file")->required();
  plan->add_option("--set", overrides, "Override a config key: key.path=value (repeatable)");
  plan->add_flag("--json", plan_json, "Print the plan as JSON");
  plan->add_flag("--compare", plan_options.compare, "Simulate every schedule side by side");
  plan->add_option("--trace", plan_trace, "Write the simulated timeline of one step (Chrome trace JSON)");
  plan->add_option("--save-costs", save_costs, "Write the profiled per-layer costs (a cost file for partition)");
  plan->add_option("--costs", plan_options.costs_path, "Use this cost file instead of profiling");
  plan->add_option("--repeat", plan_options.repeat, "Profiling runs per op (the median is used)")->check(CLI::PositiveNumber);
  pt::AutoPlanOptions auto_options;
  bool plan_auto = false;
  plan->add_flag("--auto", plan_auto, "Search stages, micro-batches, schedule, recomputation, precision and balance");
  plan->add_option("--devices", auto_options.devices, "--auto: devices to plan for (default pipeline.stages x pipeline.data_parallel, or the cost file's devices)")
      ->check(CLI::Range(1, 4096));
  plan->add_option("--memory-limit", auto_options.memory_limit, "--auto: bytes per device (one, or one per device)")
      ->delimiter(',')->check(CLI::PositiveNumber);
  plan->add_option("--memory-headroom", auto_options.memory_headroom,
                   "--auto: share of each limit kept free for what the memory model misses (default 0.05)")
      ->check(CLI::Range(0.0, 0.9));
  plan->add_option("--speeds", auto_options.speeds, "--auto: relative speed of each device")->delimiter(',')
      ->check(CLI::PositiveNumber);
  plan->add_option("--top", auto_options.top, "--auto: plans to list (default 5)")->check(CLI::Range(1, 1000));
  plan->add_option("--write-config", auto_options.write_config, "--auto: write the chosen plan as a config here");

  std::string costs_path;
  int partition_stages = 0;
  int64_t memory_limit = 0;
  std::vector<double> speeds;
  auto* partition = app.add_subcommand("partition", "Split a cost file into stages exactly (min-max) and print JSON");
  partition->add_option("--costs", costs_path, "JSON array of per-layer costs")->required();
  partition->add_option("--stages", partition_stages, "Number of stages")->required()->check(CLI::PositiveNumber);
  partition->add_option("--memory-limit", memory_limit,
                        "Bytes each stage may hold (parameters x3 for gradient and momentum, plus saved activations of one micro-batch)")
      ->check(CLI::NonNegativeNumber);
  partition->add_option("--speeds", speeds, "Relative speed of each stage's device (one per stage)")->delimiter(',');

  pt::SimulateOptions sim_options;
  std::string sim_recompute = "never", sim_trace;
  bool sim_json = false;
  auto* simulate = app.add_subcommand("simulate", "Simulate a schedule on a cost file: step, bubble, memory per stage");
  simulate->add_option("--costs", sim_options.costs_path, "Cost file (plan --save-costs, costs transformer)")->required();
  simulate->add_option("--stages", sim_options.stages, "Devices")->required()->check(CLI::Range(1, 100000));
  simulate->add_option("--micro-batches", sim_options.micro_batches, "Micro-batches per step")->required()->check(CLI::Range(1, 1000000));
  std::string sim_schedule = pipetrain::schedule::name(sim_options.schedule);
  simulate->add_option("--schedule", sim_schedule, "Schedule kind")
      ->check(CLI::IsMember(pipetrain::schedule::kind_names()));
  simulate->add_option("--chunks", sim_options.chunks, "Virtual stages per device (default: 2 for kinds with chunks)")
      ->check(CLI::Range(1, 64));
  simulate->add_option("--recompute", sim_recompute, "never, always or except_last (as pipeline.recompute)")
      ->check(CLI::IsMember(pipetrain::recompute_modes()));
  simulate->add_option("--memory-limit", sim_options.memory_limit, "zb-auto: activation bytes per device (default: twice 1f1b's)")
      ->check(CLI::NonNegativeNumber);
  simulate->add_option("--bandwidth", sim_options.bandwidth_gb_s, "Link bandwidth in GB/s (instead of the file's)")
      ->check(CLI::NonNegativeNumber);
  simulate->add_option("--latency-ms", sim_options.latency_ms, "Link latency in ms (instead of the file's)")
      ->check(CLI::NonNegativeNumber);
  simulate->add_option("--trace", sim_trace, "Write the simulated step with memory counters (Chrome trace JSON)");
  simulate->add_flag("--json", sim_json, "Print one JSON object");

  pt::TransformerShape shape;
  std::string costs_out;
  auto* costs = app.add_subcommand("costs", "Write cost files for hardware this machine does not have");
  costs->require_subcommand(1);
  auto* transformer = costs->add_subcommand("transformer", "A decoder-only transformer's costs from its FLOP and byte counts");
  transformer->add_option("--layers", shape.layers, "Transformer blocks")->required()->check(CLI::Range(1, 100000));
  transformer->add_option("--hidden", shape.hidden, "Hidden size")->required()->check(CLI::Range(1, 1000000));
  transformer->add_option("--seq", shape.seq, "Sequence length")->required()->check(CLI::Range(1, 10000000));
  transformer->add_option("--heads", shape.heads, "Attention heads")->required()->check(CLI::Range(1, 100000));
  transformer->add_option("--vocab", shape.vocab, "Vocabulary size")->required()->check(CLI::Range(1, 100000000));
  transformer->add_option("--micro-batch", shape.micro_batch, "Sequences per micro-batch")->required()->check(CLI::Range(1, 1000000));
  transformer->add_option("--device-tflops", shape.device_tflops, "Peak dense TFLOP/s of one device (default 400)")
      ->check(CLI::PositiveNumber);
  transformer->add_option("--efficiency", shape.efficiency, "Share of the peak reached (default 0.5)")->check(CLI::Range(0.001, 1.0));
  transformer->add_option("--bandwidth", shape.bandwidth_gb_s, "Link bandwidth between stages in GB/s (default 50)")
      ->check(CLI::PositiveNumber);
  transformer->add_option("--latency-ms", shape.latency_ms, "Link latency in ms (default 0.01)")->check(CLI::NonNegativeNumber);
  transformer->add_option("--bytes-per-value", shape.bytes_per_value, "Bytes per activation value (default 2: bf16)")
      ->check(CLI::Range(1, 8));
  transformer->add_option("--out", costs_out, "Write the cost file here (default: standard output)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    report(std::string(e.what()) + " (see --help)");
    return 2;
  }

  try {
    pipetrain::apps::install_faults_from_environment();
    if (*partition) {
      run_partition(costs_path, partition_stages, memory_limit, speeds);
      return 0;
    }
    if (*simulate) {
      sim_options.recompute = pipetrain::parse_recompute(sim_recompute);
      sim_options.schedule = pipetrain::schedule::parse_kind(sim_schedule);
      const pt::SimulateReport r = pt::simulate_cost_file(sim_options);
      if (!sim_trace.empty()) pt::write_simulation_trace(sim_trace, r);
      pt::print_simulation(std::cout, r, sim_json);
      return 0;
    }
    if (*costs) {
      const auto file = pt::transformer_costs(shape);
      if (costs_out.empty()) {
        pipetrain::partitioner::write_cost_file(std::cout, file);
      } else {
        // A failed write leaves no half file (common/atomic_file.h).
        std::ostringstream text;
        pipetrain::partitioner::write_cost_file(text, file);
        try {
          pipetrain::write_file_atomically(costs_out, text.str());
        } catch (const pipetrain::IoError& e) {
          throw pipetrain::ConfigError("--out " + costs_out + ": " + e.what());
        }
        std::printf("wrote %zu layers to %s\n", file.layers.size(), costs_out.c_str());
      }
      return 0;
    }
    if (*launcher) {
      char self[4096];
      const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
      launch_options.self = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(argv[0]);
      return pipetrain::launch::run(launch_options);
    }
    if (*exporter) {
      const std::string dir = pt::find_checkpoint(checkpoint_path);
      const size_t n = pt::export_checkpoint(dir, export_out);
      std::printf("exported %zu tensors of %s to %s\n", n, dir.c_str(), export_out.c_str());
      return 0;
    }
    if (!old_recompute_flag.empty())
      throw pipetrain::ConfigError("bench --checkpoint: renamed --recompute (the recomputation modes to sweep)");
    // The file is read and checked as written; --steps then replaces its train.steps.
    pt::Config config = pt::load_config(config_path, overrides, "--set");
    if (!steps.empty()) config.train.steps = parse_steps_flag(steps);
    ProgressLine progress(quiet, config.train.log_every);
    if (*train && train_auto) {
      if (config.runtime.kind == "processes")
        throw pipetrain::ConfigError("train --auto: plan with `plan --auto --write-config FILE` and launch the ranks on FILE "
                                     "(each rank would profile on its own and could choose another plan)");
      pt::AutoPlanOptions ao;
      const pt::AutoPlanReport r = pt::auto_plan(config, ao);
      pt::print_auto_plan(std::cout, r, 3);
      std::cout << "\n" << std::flush;
      config = r.chosen;
    }
    if (*train) {
      pt::Job job = pt::prepare(config);
      train_options.metrics_path = metrics_path;
      train_options.trace_path = trace_path;
      train_options.trace_steps = trace_steps;
      train_options.observers = {&progress};
      train_options.names = {"--checkpoint-dir", "--resume", "--until-step", "--metrics", "--trace", "--tensorboard"};
      // SIGINT/SIGTERM finish the step and save, when the run saves checkpoints.
      std::optional<StopSignals> signals;
      if (!train_options.checkpoint_dir.empty() || !config.train.checkpoint_dir.empty()) signals.emplace();
      train_options.stop_requested = [] { return StopSignals::requested(); };
      pt::TrainResult r = pt::train(job, train_options);
      if (r.signal) return 128 + r.signal;
      if (r.rank > 0) return 0;  // runtime.kind processes: rank 0 reports
      if (r.stopped_at > 0)
        std::printf("stopped at step %lld; checkpoint %s\n", static_cast<long long>(r.stopped_at), r.checkpoint.c_str());
      else if (r.test_samples > 0)
        std::printf("%s; %.1f samples/s in training\n", pt::describe_test(r).c_str(), r.samples_per_s);
      else
        std::printf("final loss %.4f; %.1f samples/s in training\n", r.losses.empty() ? 0.0 : r.losses.back(),
                    r.samples_per_s);
    } else if (*eval) {
      if (eval_batches >= 0) config.train.eval_batches = eval_batches;
      pt::Job job = pt::prepare(config);
      const pt::CheckpointState st = pt::load_weights(pt::find_checkpoint(checkpoint_path), config, job.model.layers, job.model.ties);
      const pt::TrainResult r = pt::evaluate_model(job, [&](const std::string& text) { progress.note(text); });
      if (r.rank > 0) {
        // runtime.kind processes: rank 0 reports
      } else if (eval_json) {
        nlohmann::json j = pt::test_results_json(r);
        j["checkpoint"] = st.dir;
        j["step"] = st.step;
        std::cout << j.dump() << "\n";
      } else {
        std::printf("%s (checkpoint %s, step %lld)\n", pt::describe_test(r).c_str(), st.dir.c_str(),
                    static_cast<long long>(st.step));
      }
    } else if (*generate) {
      pt::Job job = pt::prepare(config);  // one process: no balance needed
      pt::load_weights(pt::find_checkpoint(checkpoint_path), config, job.model.layers, job.model.ties);
      gen_options.seq_len = job.model.sample_shape.empty() ? 0 : job.model.sample_shape.back();
      const std::string text = pt::generate(job.model.layers, prompt, gen_options);
      std::fwrite(prompt.data(), 1, prompt.size(), stdout);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::printf("\n");
    } else if (*plan && plan_auto) {
      auto_options.costs_path = plan_options.costs_path;
      auto_options.repeat = plan_options.repeat == 5 ? 3 : plan_options.repeat;
      const pt::AutoPlanReport r = pt::auto_plan(config, auto_options);
      if (plan_json) {
        pt::print_auto_plan_json(std::cout, r);
      } else {
        pt::print_auto_plan(std::cout, r, auto_options.top);
        if (!auto_options.write_config.empty()) std::printf("wrote %s\n", auto_options.write_config.c_str());
      }
    } else if (*plan) {
      pt::PlanReport r = pt::make_plan(config, plan_options);
      if (!save_costs.empty()) pipetrain::profiler::save_costs(save_costs, r.profile);
      if (!plan_trace.empty()) {
        std::ofstream f(plan_trace, std::ios::out | std::ios::trunc);
        if (!f) throw pipetrain::ConfigError("--trace " + plan_trace + ": cannot open for writing");
        pipetrain::schedule::write_chrome_trace(f, {pt::simulated_timeline(config, r)});
        if (!f) throw pipetrain::Error("--trace " + plan_trace + ": write failed");
      }
      if (plan_json)
        pt::print_plan_json(std::cout, r);
      else
        pt::print_plan(std::cout, r);
    } else if (*bench) {
      const bool sweeping = !sweep.stages.empty() || !sweep.micro_batches.empty() || !sweep.data_parallel.empty() ||
                            !sweep.recompute.empty() ||
                            !sweep.schedules.empty() || !sweep.precisions.empty() || !bench_json.empty();
      if (!sweeping) {
        pt::BenchResult r = pt::run_bench(config, bench_options);
        pt::print_bench(std::cout, config, r);
        return 0;
      }
      if (sweep.stages.empty()) sweep.stages = {config.pipeline.stages};
      if (sweep.micro_batches.empty()) sweep.micro_batches = {config.pipeline.micro_batches};
      if (sweep.recompute.empty()) sweep.recompute = {pipetrain::recompute_name(config.pipeline.recompute)};
      if (sweep.schedules.empty()) sweep.schedules = {pipetrain::schedule::name(config.pipeline.schedule)};
      sweep.bench = bench_options;
      sweep.override_flag = "--set";
      sweep.bench.profile = false;
      std::ofstream json;
      if (!bench_json.empty()) {
        json.open(bench_json, std::ios::out | std::ios::app);
        if (!json) throw pipetrain::ConfigError("--json " + bench_json + ": cannot open for writing");
      }
      pt::run_sweep(config_path, overrides, sweep, std::cout, json.is_open() ? &json : nullptr);
      if (json.is_open() && !json.flush()) throw pipetrain::Error("--json " + bench_json + ": write failed");
    }
  } catch (const pipetrain::ConfigError& e) {
    report(e.what());
    return 2;
  } catch (const pipetrain::Error& e) {
    report(e.what());
    return 1;
  } catch (const c10::Error& e) {
    report(e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    report(e.what());
    return 1;
  }
  return 0;
}
