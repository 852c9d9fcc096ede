#include "train/bench.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <thread>

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <torch/version.h>

#include "common/config.h"
#include "common/error.h"
#include "common/stats.h"
#include "common/strings.h"
#include "pipeline/optimizer_state.h"
#include "job/balance.h"
#include "planner/deferral.h"
#include "planner/plan.h"
#include "job/single_device.h"
#include "stages/device.h"
#include "pipeline/step_trace.h"

namespace pipetrain::job {}
namespace pipetrain::checkpoint {}
namespace pipetrain::planner {}

namespace pipetrain::train {

using namespace ::pipetrain::job;         // configs and jobs
using namespace ::pipetrain::checkpoint;  // checkpoints
using namespace ::pipetrain::planner;     // plans and predictions

int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmHWM:") {
      int64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

void reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
}

namespace {

template <typename Step>
BenchMeasure measure(const std::string& name, int threads, const BenchOptions& o, Step step) {
  BenchMeasure m;
  m.name = name;
  m.threads = threads;
  // Hand freed heap back first: the process keeps freed tensors resident (main.cpp's mallopt),
  // so without this the high-water mark would start at what earlier phases left behind.
  malloc_trim(0);
  reset_peak_rss();
  std::vector<double> times;
  double timed = 0;
  for (int i = 0; i < o.warmup + kMaxTimedSteps; ++i) {
    if (i >= o.warmup + o.repeat && timed >= o.min_time_s) break;
    const auto t0 = Clock::now();
    step(i);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (i >= o.warmup) times.push_back(s), timed += s;
  }
  m.peak_rss_bytes = peak_rss_bytes();
  std::sort(times.begin(), times.end());
  m.steps = static_cast<int>(times.size());
  m.median_step_s = median(times);
  m.min_step_s = times.front();
  m.max_step_s = times.back();
  return m;
}

// The longest stage's reduction in a step, and how much of it outlasted every stage's last
// other action, in seconds.
std::pair<double, double> reduction_times(const StepTrace& t) {
  double lists_end = 0;
  for (const auto& spans : t.spans)
    for (const pipeline::Span& sp : spans)
      if (sp.op != schedule::Op::Reduce) lists_end = std::max(lists_end, sp.end);
  double longest = 0, outlasting = 0;
  for (const auto& spans : t.spans) {
    double busy = 0, end = 0;
    for (const pipeline::Span& sp : spans)
      if (sp.op == schedule::Op::Reduce) busy += sp.end - sp.start, end = std::max(end, sp.end);
    longest = std::max(longest, busy);
    outlasting = std::max(outlasting, std::max(0.0, end - lists_end));
  }
  return {longest, outlasting};
}

void set_rates(BenchMeasure& m, int64_t batch) {
  m.samples_per_s = batch / m.median_step_s;
  m.max_samples_per_s = batch / m.min_step_s;
  m.min_samples_per_s = batch / m.max_step_s;
}

}  // namespace

BenchResult run_bench(const Config& c, const BenchOptions& o) {
  if (o.repeat < 1) throw ConfigError("bench: repeat must be >= 1");
  if (!(o.min_time_s >= 0) || o.min_time_s > 3600)
    throw ConfigError(detail::concat("bench: min-time must be between 0 and 3600 seconds, got ", o.min_time_s));
  if (c.runtime.kind == job::RuntimeKind::Processes)
    throw ConfigError(c.where("runtime.kind") + ": pipetrain bench measures stages as threads of one process; "
                      "bench/processes.sh compares runtime.kind processes with threads");
  BenchResult r;
  Job job = prepare_balanced(c);
  planner::resolve_deferral(job);  // "auto" as a run decides it
  r.deferred = job.options.defer_weight_grads;
  r.deferral = job.deferral;
  const int64_t B = c.data.batch_size;
  std::vector<Batch> batches;
  // Steps past these (bench's min-time) take them again, in turn.
  for (int i = 0; i < o.warmup + o.repeat; ++i) batches.push_back(to_model(job, job.data.train_batch(i, B, c.train.seed)));
  auto batch = [&](int i) -> const Batch& { return batches[static_cast<size_t>(i) % batches.size()]; };
  auto fresh_model = [&] { return build_model(c).layers; };

  const int per_stage = job.options.intra_op_threads;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // The plain loop runs on the first stage's device (a GPU's baseline is that GPU), its batch
  // brought there inside the timed step as the pipeline's is.
  const c10::Device device = job.devices.per_stage.at(0);
  auto baseline = [&](const std::string& name, int threads) {
    at::set_num_threads(threads);
    torch::nn::Sequential model = fresh_model();
    model->to(device);
    SingleDevice plain(model, mean_cross_entropy, make_optimizer_factory(c.optimizer), c.train.seed, c.train.precision,
                       job.model.ties);
    auto step = [&](int i) { plain.train_step(batch(i).input.to(device), batch(i).target.to(device)); };
    BenchMeasure m = measure(name, threads, o, step);
    set_rates(m, B);
    if (threads == per_stage) {
      // Gradients are allocated inside the counted step, as the pipeline's are.
      for (auto& p : plain.parameters()) p.mutable_grad() = at::Tensor();
      const auto ctx = stages::make_device_context(device);
      profiler::MemoryCounter counter;
      ctx->reset_peak();
      step(0);
      r.prediction.baseline_peak_tensor_bytes = device.is_cpu() ? counter.peak() : ctx->peak_bytes();
    }
    return m;
  };
  r.baseline = baseline("single-device", per_stage);
  r.baseline_all_cores = baseline("single-device, all cores", cores);

  Pipeline pipe(fresh_model(), job.options, mean_cross_entropy);
  pipe.optimizers().set(make_optimizer_factory(c.optimizer));
  std::vector<StepTrace> traces;  // simulated after the timing, not inside it
  std::vector<double> timed;      // each step as timed around train_step
  r.pipeline = measure("pipeline", per_stage, o, [&](int i) {
    const auto start = Clock::now();
    pipe.train_step(batch(i).input, batch(i).target);
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    if (i >= o.warmup) traces.push_back(pipe.last_trace()), timed.push_back(s);
  });
  {
    std::vector<size_t> order(traces.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return traces[a].wall < traces[b].wall; });
    const size_t mid = order[order.size() / 2];
    r.prediction.breakdown = pipeline::breakdown(traces[mid]);
    r.prediction.breakdown_wall_s = traces[mid].wall;
    r.prediction.breakdown_timed_s = timed[mid];
  }
  std::vector<std::pair<double, double>> wall_bubble;
  std::vector<double> walls, simulated;
  std::vector<std::pair<double, double>> sim_bubbles;  // (wall, simulated bubble)
  std::vector<double> reduces, exposed;
  for (const StepTrace& t : traces) {
    if (c.pipeline.data_parallel > 1) {
      const auto [reduce, outlasting] = reduction_times(t);
      reduces.push_back(reduce * 1e3);
      exposed.push_back(outlasting * 1e3);
    }
    wall_bubble.push_back({t.wall, bubble(t)});
    walls.push_back(t.wall);
    const auto sim = schedule::simulate(pipe.schedule(), measured_costs(t, pipe.schedule()));
    simulated.push_back(sim.makespan_ms / 1e3);
    sim_bubbles.push_back({t.wall, sim.bubble});
    r.prediction.peak_in_flight = t.peak_in_flight;
  }
  set_rates(r.pipeline, B);
  r.balance = pipe.balance();
  std::sort(wall_bubble.begin(), wall_bubble.end());
  r.pipeline.bubble = wall_bubble[wall_bubble.size() / 2].second;
  std::sort(sim_bubbles.begin(), sim_bubbles.end());
  r.prediction.simulated_bubble = sim_bubbles[sim_bubbles.size() / 2].second;
  {
    profiler::MemoryCounter counter;
    for (int d = 0; d < pipe.stages(); ++d) pipe.take_device_peak(d);  // the peaks of this step alone
    pipe.train_step(batches[0].input, batches[0].target);
    r.prediction.pipeline_peak_tensor_bytes = counter.peak();
    // Copy 0's stage r allocates into account r (pipeline/executor.cpp).
    for (int d = 0; d < pipe.stages(); ++d)  // a GPU stage's peak is its CUDA allocator's
      r.prediction.device_peak_bytes.push_back(std::max<int64_t>(counter.peak(d) + held_bytes(pipe, d), pipe.take_device_peak(d)));
  }
  r.prediction.measured_step_s = median(walls);
  r.prediction.simulated_step_s = median(simulated);
  r.prediction.reduce_ms = median(reduces);
  r.prediction.exposed_reduce_ms = median(exposed);
  for (int vs = 0; vs < pipe.schedule().virtual_stages(); ++vs)
    if (torch::optim::Optimizer* opt = pipe.optimizers().of(vs)) r.prediction.optimizer_state_bytes += pipeline::state_bytes(*opt);
  if (!o.profile) return r;
  // What `pipetrain plan` predicts for this balance from per-layer profiles.
  at::set_num_threads(per_stage);
  const profiler::Profile profile = profile_job(job);
  const bool deferring = job.options.defer_weight_grads && any_deferred(profile);
  const profiler::Profile whole = deferring ? whole_batch_profile(job, 5) : profiler::Profile{};
  PlanPoint pt;
  pt.schedule = pipe.schedule().kind;
  pt.stages = pipe.stages(), pt.micro_batches = pipe.schedule().micro_batches, pt.chunks = pipe.schedule().chunks;
  pt.recompute = job.options.recompute;
  pt.defer = deferring;
  pt.balance = pipe.balance();
  pt.data_parallel = {c.pipeline.data_parallel, pipe.optimizers().sharded(), reduce_link(c.pipeline.data_parallel, nullptr), {}};
  pt.state_factor = state_factor(c.optimizer, c.train.precision, c.pipeline.data_parallel, pipe.optimizers().sharded());
  pt.ties = tie_costs(job.model);
  const Prediction predicted = predict(pt, profile, &whole, &pipe.schedule());
  r.prediction.profiled_step_s = predicted.step_ms / 1e3;
  r.prediction.predicted_device_peak_bytes = predicted.peak_bytes;
  return r;
}

namespace {

// The parts of a breakdown, in the order they are shown: a name and how to read it.
struct Part {
  const char* key;
  const char* label;
  double pipeline::StageBreakdown::*field;
};
const std::vector<Part>& parts() {
  using B = pipeline::StageBreakdown;
  static const std::vector<Part> p{
      {"forward_ms", "forward", &B::forward},
      {"backward_ms", "backward", &B::backward},
      {"backward_input_ms", "backward input (B)", &B::backward_input},
      {"backward_weight_ms", "backward weight (W)", &B::backward_weight},
      {"recompute_ms", "recomputation", &B::recompute},
      {"wait_input_ms", "waiting for input", &B::wait_input},
      {"wait_grad_ms", "waiting for gradient", &B::wait_grad},
      {"send_ms", "sending", &B::send},
      {"between_ms", "between actions", &B::between},
      {"reduce_wait_ms", "waiting for reductions", &B::reduce_wait},
      {"idle_start_ms", "idle at the start", &B::idle_start},
      {"end_wait_ms", "waiting for the other stages", &B::end_wait},
      {"optimizer_ms", "optimizer", &B::optimizer},
      {"idle_end_ms", "idle at the end", &B::idle_end}};
  return p;
}

double mean_of(const std::vector<pipeline::StageBreakdown>& b, double (*f)(const pipeline::StageBreakdown&)) {
  double sum = 0;
  for (const auto& s : b) sum += f(s);
  return b.empty() ? 0 : sum / static_cast<double>(b.size());
}

// `copies`: data-parallel copies; the parts are then the first copy's stages', and the wait before
// the optimizers also holds the slowest copy and the merge of BatchNorm statistics over them.
void print_breakdown(std::ostream& out, const BenchResult& r, int copies) {
  const BenchPrediction& p = r.prediction;
  if (p.breakdown.empty()) return;
  const auto& b = p.breakdown;
  out << "the median step in parts (ms; each stage's parts tile its step"
      << (copies > 1 ? "; copy 0's stages" : "") << "):\n" << std::left << std::setw(30) << "part" << std::right;
  for (size_t s = 0; s < b.size(); ++s) out << std::setw(10) << detail::concat("stage ", s);
  out << "\n" << std::fixed << std::setprecision(2);
  for (const Part& part : parts()) {
    bool any = false;
    for (const auto& s : b) any = any || s.*part.field > 0;
    if (!any) continue;
    const bool others = copies > 1 && part.field == &pipeline::StageBreakdown::end_wait;
    out << std::left << std::setw(30) << (others ? "waiting for stages, copies" : part.label) << std::right;
    for (const auto& s : b) out << std::setw(10) << s.*part.field * 1e3;
    out << "\n";
  }
  out << std::left << std::setw(30) << "= the executor's step" << std::right;
  for (const auto& s : b) out << std::setw(10) << s.total() * 1e3;
  out << "\n" << std::left << std::setw(30) << "page faults (first touches)" << std::right;
  for (const auto& s : b) out << std::setw(10) << s.page_faults;
  const double outside = p.breakdown_timed_s - p.breakdown_wall_s;
  out << "\nthe step as timed " << p.breakdown_timed_s * 1e3 << " ms: the executor's " << p.breakdown_wall_s * 1e3
      << " ms and " << outside * 1e3 << " ms outside it (splitting the batch, the loss)\n";
  // The gap to the plain loop on every core, as the mean stage spends it.
  using B = pipeline::StageBreakdown;
  const double plain = r.baseline_all_cores.median_step_s;
  const double compute = mean_of(b, [](const B& s) { return s.compute(); });
  const double waiting = mean_of(b, [](const B& s) { return s.wait_input + s.wait_grad + s.reduce_wait + s.end_wait; });
  const double moving = mean_of(b, [](const B& s) { return s.send + s.between; });
  const double ends = mean_of(b, [](const B& s) { return s.idle_start + s.idle_end; });
  const double optimizer = mean_of(b, [](const B& s) { return s.optimizer; });
  const double gap = p.breakdown_timed_s - plain;
  out << "against the plain loop on all cores (" << plain * 1e3 << " ms), the step is " << std::showpos << gap * 1e3
      << std::noshowpos << " ms; the mean stage: compute " << compute * 1e3 << " ms (" << std::showpos
      << (compute - plain) * 1e3 << std::noshowpos << " ms against the plain step), waiting " << waiting * 1e3
      << ", sending and between actions " << moving * 1e3 << ", idle at the ends " << ends * 1e3 << ", optimizer "
      << optimizer * 1e3 << ", outside " << outside * 1e3 << "\n";
}

}  // namespace

nlohmann::json breakdown_json(const BenchPrediction& p) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : p.breakdown) {
    nlohmann::json j;
    for (const Part& part : parts()) j[part.key] = s.*part.field * 1e3;
    j["total_ms"] = s.total() * 1e3;
    j["page_faults"] = s.page_faults;
    stages.push_back(j);
  }
  return {{"stages", stages}, {"wall_ms", p.breakdown_wall_s * 1e3}, {"timed_ms", p.breakdown_timed_s * 1e3},
          {"outside_ms", (p.breakdown_timed_s - p.breakdown_wall_s) * 1e3}};
}

void print_bench(std::ostream& out, const Config& c, const BenchResult& r) {
  const int D = c.pipeline.data_parallel;
  out << "batch " << c.data.batch_size << ", " << c.pipeline.stages << " stages, "
      << (D > 1 ? detail::concat(D, " data-parallel copies", c.train.shard_optimizer ? " (sharded optimizer)" : "", ", ") : "")
      << c.pipeline.micro_batches
      << " micro-batches, schedule " << c.pipeline.schedule << ", recompute " << recompute_name(c.pipeline.recompute)
      << planner::deferral_words(r.deferred, r.deferral)
      << ", precision " << precision_name(c.train.precision)
      << ", balance " << job::choice_name(c.pipeline.balance_method) << " " << partitioner::to_string(r.balance) << "\n";
  out << std::left << std::setw(28) << "run" << std::right << std::setw(9) << "threads" << std::setw(14)
      << "median step" << std::setw(14) << "samples/s" << std::setw(11) << "vs plain" << std::setw(14)
      << "peak RSS" << std::setw(8) << "steps" << "\n";
  for (const BenchMeasure* m : {&r.baseline, &r.baseline_all_cores, &r.pipeline}) {
    std::ostringstream step, ratio, rss;
    step << std::fixed << std::setprecision(2) << m->median_step_s * 1e3 << " ms";
    ratio << std::fixed << std::setprecision(2) << m->samples_per_s / r.baseline.samples_per_s << "x";
    rss << std::fixed << std::setprecision(0) << m->peak_rss_bytes / (1024.0 * 1024.0) << " MiB";
    out << std::left << std::setw(28) << m->name << std::right << std::setw(9)
        << (m == &r.pipeline ? std::to_string(m->threads) + "/st" : std::to_string(m->threads))
        << std::setw(14) << step.str() << std::setw(14) << std::fixed << std::setprecision(1)
        << m->samples_per_s << std::setw(11) << ratio.str() << std::setw(14) << rss.str() << std::setw(8) << m->steps
        << "\n";
  }
  const double K = c.pipeline.stages, M = c.pipeline.micro_batches;
  out << std::fixed << std::setprecision(3) << "pipeline / plain (same threads per stage): "
      << r.pipeline.samples_per_s / r.baseline.samples_per_s << "x (ideal " << (D > 1 ? "D*" : "")
      << "K*M/(M+K-1) = " << D * K * M / (M + K - 1)
      << "x); pipeline / plain (all cores): " << r.pipeline.samples_per_s / r.baseline_all_cores.samples_per_s
      << "x; measured bubble " << r.pipeline.bubble << " (fill-drain " << (K - 1) / (M + K - 1) << ")\n";
  const BenchPrediction& p = r.prediction;
  std::vector<std::string> in_flight;
  for (int n : p.peak_in_flight) in_flight.push_back(std::to_string(n));
  out << std::setprecision(2) << "step " << p.measured_step_s * 1e3 << " ms measured; simulated from its measured op costs "
      << p.simulated_step_s * 1e3 << " ms (" << std::showpos << 100 * (p.simulated_step_s / p.measured_step_s - 1)
      << std::noshowpos << "%)";
  if (p.profiled_step_s > 0)
    out << "; from profiled layer costs " << p.profiled_step_s * 1e3 << " ms (" << std::showpos
        << 100 * (p.profiled_step_s / p.measured_step_s - 1) << std::noshowpos << "%)";
  out << "; peak in-flight micro-batches " << join(in_flight, "/") << "\n";
  std::vector<std::string> measured_mib, predicted_mib;
  for (int64_t b : p.device_peak_bytes) measured_mib.push_back(detail::concat(std::lround(b / 1048576.0)));
  for (double b : p.predicted_device_peak_bytes) predicted_mib.push_back(detail::concat(std::lround(b / 1048576.0)));
  out << "peak memory per device (MiB: its tensors, parameters and optimizer state): " << join(measured_mib, "/")
      << (predicted_mib.empty() ? "" : "; predicted " + join(predicted_mib, "/")) << "\n";
  out << "peak tensor memory in a step: plain " << p.baseline_peak_tensor_bytes / (1024.0 * 1024.0)
      << " MiB, pipeline " << p.pipeline_peak_tensor_bytes / (1024.0 * 1024.0) << " MiB (all stages"
      << (D > 1 ? ", every copy" : "") << ")\n";
  print_breakdown(out, r, D);
  if (D > 1)
    out << "data parallel: the longest stage's reduction " << p.reduce_ms << " ms ("
        << 100 * p.reduce_ms / (p.measured_step_s * 1e3) << "% of the step), " << p.exposed_reduce_ms
        << " ms of it after the last action (" << (p.reduce_ms > 0 ? std::max(0.0, 100 * (1 - p.exposed_reduce_ms / p.reduce_ms)) : 0.0)
        << "% hidden); optimizer state of copy 0 " << p.optimizer_state_bytes / (1024.0 * 1024.0) << " MiB\n";
}

}  // namespace pipetrain::train

namespace pipetrain::train {

namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  return "unknown";
}

// The BLAS libtorch calls, from its build settings ("mkl: Intel(R) oneAPI Math Kernel Library
// Version 2024.2 ...").
std::string blas_library() {
  const std::string config = at::show_config();
  const auto pos = config.find("BLAS_INFO=");
  if (pos == std::string::npos) return "unknown";
  std::string blas = config.substr(pos + 10, config.find_first_of(", \n", pos + 10) - pos - 10);
  std::istringstream lines(config);
  std::string line;
  while (std::getline(lines, line))
    if (line.find("Math Kernel Library") != std::string::npos || line.find("OpenBLAS") != std::string::npos) {
      blas += ": " + line.substr(line.find_first_not_of(" -"));
      break;
    }
  return blas;
}

nlohmann::json machine_json() {
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  return {{"cpu", cpu_model()},
          {"cores", std::thread::hardware_concurrency()},
          {"libtorch", TORCH_VERSION},
          {"blas", blas_library()},
          {"openblas_coretype", coretype ? coretype : ""},
          {"pipetrain", PIPETRAIN_VERSION}};
}

}  // namespace

void run_sweep(const std::string& path, const std::vector<std::string>& overrides, const SweepOptions& o,
               std::ostream& progress, std::ostream* json_lines) {
  const Config base = load_config(path, overrides);
  const nlohmann::json& base_json = base.root;  // the file with the overrides applied
  const nlohmann::json machine = machine_json();
  const std::vector<std::string> precisions =
      o.precisions.empty() ? std::vector<std::string>{precision_name(base.train.precision)} : o.precisions;
  const std::vector<int> copies = o.data_parallel.empty() ? std::vector<int>{base.pipeline.data_parallel} : o.data_parallel;
  const size_t total = o.stages.size() * copies.size() * o.micro_batches.size() * o.recompute.size() *
                       o.schedules.size() * precisions.size();
  size_t done = 0;
  for (int k : o.stages)
    for (int d : copies)
    for (int m : o.micro_batches)
      for (const auto& mode : o.recompute)
        for (const auto& sched : o.schedules) {
          // The precisions of one combination run back to back, each compared with the first.
          std::optional<BenchResult> first;
          for (const auto& precision : precisions) {
            ++done;
            std::vector<std::string> sets = overrides;
            for (const std::string& s : precision_overrides(base, precision)) sets.push_back(s);
            sets.push_back("pipeline.stages=" + std::to_string(k));
            sets.push_back("pipeline.data_parallel=" + std::to_string(d));
            sets.push_back("pipeline.micro_batches=" + std::to_string(m));
            sets.push_back("pipeline.recompute=" + mode);
            sets.push_back("pipeline.schedule=" + sched);
            const int chunks = schedule::chunks_for(schedule::parse_kind(sched), base.pipeline.chunks);
            sets.push_back("pipeline.chunks=" + std::to_string(chunks));
            if (base.pipeline.balance_method == job::BalanceMethod::List && static_cast<int>(base.pipeline.balance.size()) != k * chunks)
              sets.push_back("pipeline.balance=uniform");
            nlohmann::json line{{"config_file", path}, {"stages", k}, {"data_parallel", d}, {"micro_batches", m}, {"schedule", sched},
                                {"chunks", chunks}, {"recompute", mode}, {"precision", precision}};
            char head[200];
            std::snprintf(head, sizeof head, "[%zu/%zu] K=%d%s M=%d %s %s%s%s: ", done, total, k,
                          d > 1 ? detail::concat(" D=", d).c_str() : "", m, sched.c_str(),
                          mode.c_str(), o.precisions.empty() ? "" : " ", o.precisions.empty() ? "" : precision.c_str());
            try {
              const Config c = load_config(path, sets);
              BenchResult r = run_bench(c, o.bench);
              const double K = k, M = m, v = chunks;
              line["balance"] = r.balance;
              line["deferred_weight_grads"] = r.deferred;
              line["batch_size"] = c.data.batch_size;
              line["threads_per_stage"] = r.pipeline.threads;
              line["baseline_threads"] = r.baseline.threads;
              line["baseline_all_cores_threads"] = r.baseline_all_cores.threads;
              line["baseline_samples_per_s"] = r.baseline.samples_per_s;
              line["baseline_samples_per_s_range"] = {r.baseline.min_samples_per_s, r.baseline.max_samples_per_s};
              line["baseline_all_cores_samples_per_s"] = r.baseline_all_cores.samples_per_s;
              line["pipeline_samples_per_s"] = r.pipeline.samples_per_s;
              line["pipeline_samples_per_s_range"] = {r.pipeline.min_samples_per_s, r.pipeline.max_samples_per_s};
              line["timed_steps"] = {r.baseline.steps, r.baseline_all_cores.steps, r.pipeline.steps};
              line["speedup"] = r.pipeline.samples_per_s / r.baseline.samples_per_s;
              line["speedup_all_cores"] = r.pipeline.samples_per_s / r.baseline_all_cores.samples_per_s;
              line["ideal_speedup"] = d * K * M / (M + (K - 1) / v);
              line["bubble_measured"] = r.pipeline.bubble;
              line["bubble_predicted"] = r.prediction.simulated_bubble;
              line["bubble_formula"] = (K - 1) / (v * M + K - 1);
              line["step_ms"] = r.prediction.measured_step_s * 1e3;
              line["simulated_step_ms"] = r.prediction.simulated_step_s * 1e3;
              line["peak_in_flight"] = r.prediction.peak_in_flight;
              line["peak_memory_bytes"] = r.pipeline.peak_rss_bytes;
              line["baseline_peak_memory_bytes"] = r.baseline.peak_rss_bytes;
              line["peak_tensor_bytes"] = r.prediction.pipeline_peak_tensor_bytes;
              line["baseline_peak_tensor_bytes"] = r.prediction.baseline_peak_tensor_bytes;
              line["shard_optimizer"] = c.train.shard_optimizer;
              line["device_peak_bytes"] = r.prediction.device_peak_bytes;
              if (!r.prediction.predicted_device_peak_bytes.empty())
                line["predicted_device_peak_bytes"] = r.prediction.predicted_device_peak_bytes;
              line["optimizer_state_bytes"] = r.prediction.optimizer_state_bytes;
              line["breakdown"] = breakdown_json(r.prediction);
              if (d > 1) {
                line["reduce_ms"] = r.prediction.reduce_ms;
                line["exposed_reduce_ms"] = r.prediction.exposed_reduce_ms;
              }
              progress << head << std::fixed << std::setprecision(2) << line["speedup"].get<double>() << "x (ideal "
                       << line["ideal_speedup"].get<double>() << "x), bubble " << r.pipeline.bubble << " measured / "
                       << r.prediction.simulated_bubble << " simulated, peak tensors "
                       << r.prediction.pipeline_peak_tensor_bytes / (1024.0 * 1024.0) << " MiB";
              if (d > 1)
                progress << ", reduction " << r.prediction.reduce_ms << " ms (" << r.prediction.exposed_reduce_ms
                         << " ms exposed)";
              if (first) {  // step-time speedup of this precision over the first one, plain and pipeline
                line["plain_speedup_vs_" + precisions[0]] = first->baseline.median_step_s / r.baseline.median_step_s;
                line["pipeline_speedup_vs_" + precisions[0]] = first->pipeline.median_step_s / r.pipeline.median_step_s;
                progress << "; vs " << precisions[0] << ": plain " << line["plain_speedup_vs_" + precisions[0]].get<double>()
                         << "x, pipeline " << line["pipeline_speedup_vs_" + precisions[0]].get<double>() << "x";
              } else {
                first = r;
              }
              progress << std::endl;
            } catch (const ConfigError& e) {
              line["skipped"] = e.what();
              progress << head << "skipped: " << e.what() << std::endl;
            } catch (const std::exception& e) {  // a run that fails is reported, and the sweep goes on
              line["skipped"] = std::string("failed: ") + e.what();
              progress << head << "failed: " << e.what() << std::endl;
            }
            line["machine"] = machine;
            line["config"] = base_json;
            line["repeat"] = o.bench.repeat;
            line["warmup"] = o.bench.warmup;
            line["min_time_s"] = o.bench.min_time_s;
            if (json_lines) *json_lines << line.dump() << "\n" << std::flush;
          }
        }
}

}  // namespace pipetrain::train
