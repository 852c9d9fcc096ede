#include "pipeline/bench.h"

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <thread>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "common/error.h"
#include "common/strings.h"
#include "pipeline/plan.h"
#include "pipeline/step_trace.h"

namespace pipetrain::pipeline {

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
  reset_peak_rss();
  std::vector<double> times;
  for (int i = 0; i < o.warmup + o.repeat; ++i) {
    const auto t0 = Clock::now();
    step(i);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (i >= o.warmup) times.push_back(s);
  }
  m.peak_rss_bytes = peak_rss_bytes();
  std::sort(times.begin(), times.end());
  m.median_step_s = times[times.size() / 2];
  if (times.size() % 2 == 0) m.median_step_s = (times[times.size() / 2 - 1] + times[times.size() / 2]) / 2;
  m.min_step_s = times.front();
  m.max_step_s = times.back();
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Idle share of stage time: 1 - busy / (stages * wall), busy being time spent computing.
double bubble(const StepTrace& t) {
  double busy = 0;
  for (const auto& spans : t.spans)
    for (const auto& s : spans)
      if (schedule::is_compute(s.op)) busy += s.end - s.start;
  return t.wall > 0 ? 1.0 - busy / (t.spans.size() * t.wall) : 0;
}

}  // namespace

BenchResult run_bench(const Config& c, const BenchOptions& o) {
  if (o.repeat < 1) throw ConfigError("--repeat must be >= 1");
  BenchResult r;
  Job job = prepare(c);
  const int64_t B = c.data.batch_size;
  std::vector<Batch> batches;
  for (int i = 0; i < o.warmup + o.repeat; ++i) batches.push_back(to_model(job, job.data.train_batch(i, B, c.train.seed)));
  auto fresh_model = [&] { return build_model(c).layers; };

  const int per_stage = job.options.intra_op_threads;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto baseline = [&](const std::string& name, int threads) {
    at::set_num_threads(threads);
    SingleDevice plain(fresh_model(), mean_cross_entropy, make_optimizer_factory(c.optimizer), c.train.seed);
    BenchMeasure m = measure(name, threads, o, [&](int i) { plain.train_step(batches[i].input, batches[i].target); });
    m.samples_per_s = B / m.median_step_s;
    if (threads == per_stage) {
      partitioner::MemoryCounter counter;
      plain.train_step(batches[0].input, batches[0].target);
      r.prediction.baseline_peak_tensor_bytes = counter.peak();
    }
    return m;
  };
  r.baseline = baseline("single-device", per_stage);
  r.baseline_all_cores = baseline("single-device, all cores", cores);

  Pipeline pipe(fresh_model(), job.options, mean_cross_entropy);
  pipe.set_optimizer(make_optimizer_factory(c.optimizer));
  std::vector<std::pair<double, double>> wall_bubble;
  std::vector<double> walls, simulated;
  r.pipeline = measure("pipeline", per_stage, o, [&](int i) {
    pipe.train_step(batches[i].input, batches[i].target);
    if (i < o.warmup) return;
    const StepTrace& t = pipe.last_trace();
    wall_bubble.push_back({t.wall, bubble(t)});
    walls.push_back(t.wall);
    simulated.push_back(schedule::simulate(pipe.schedule(), measured_costs(t, pipe.schedule())).makespan_ms / 1e3);
    r.prediction.peak_in_flight = t.peak_in_flight;
  });
  r.pipeline.samples_per_s = B / r.pipeline.median_step_s;
  r.balance = pipe.balance();
  std::sort(wall_bubble.begin(), wall_bubble.end());
  r.pipeline.bubble = wall_bubble[wall_bubble.size() / 2].second;
  {
    partitioner::MemoryCounter counter;
    pipe.train_step(batches[0].input, batches[0].target);
    r.prediction.pipeline_peak_tensor_bytes = counter.peak();
  }
  r.prediction.measured_step_s = median(walls);
  r.prediction.simulated_step_s = median(simulated);
  // What `pipetrain plan` predicts for this balance from per-layer profiles.
  at::set_num_threads(per_stage);
  const partitioner::Profile profile = profile_job(job);
  const auto costs = schedule_costs(profile, pipe.balance(), pipe.schedule(), job.options.recompute);
  r.prediction.profiled_step_s = schedule::simulate(pipe.schedule(), costs).makespan_ms / 1e3;
  return r;
}

void print_bench(std::ostream& out, const Config& c, const BenchResult& r) {
  out << "batch " << c.data.batch_size << ", " << c.pipeline.stages << " stages, " << c.pipeline.micro_batches
      << " micro-batches, schedule " << c.pipeline.schedule << ", checkpoint " << c.pipeline.checkpoint
      << ", balance " << c.pipeline.balance_method << " " << partitioner::to_string(r.balance) << "\n";
  out << std::left << std::setw(28) << "run" << std::right << std::setw(9) << "threads" << std::setw(14)
      << "median step" << std::setw(14) << "samples/s" << std::setw(11) << "vs plain" << std::setw(14)
      << "peak RSS" << "\n";
  for (const BenchMeasure* m : {&r.baseline, &r.baseline_all_cores, &r.pipeline}) {
    std::ostringstream step, ratio, rss;
    step << std::fixed << std::setprecision(2) << m->median_step_s * 1e3 << " ms";
    ratio << std::fixed << std::setprecision(2) << m->samples_per_s / r.baseline.samples_per_s << "x";
    rss << std::fixed << std::setprecision(0) << m->peak_rss_bytes / (1024.0 * 1024.0) << " MiB";
    out << std::left << std::setw(28) << m->name << std::right << std::setw(9)
        << (m == &r.pipeline ? std::to_string(m->threads) + "/st" : std::to_string(m->threads))
        << std::setw(14) << step.str() << std::setw(14) << std::fixed << std::setprecision(1)
        << m->samples_per_s << std::setw(11) << ratio.str() << std::setw(14) << rss.str() << "\n";
  }
  const double K = c.pipeline.stages, M = c.pipeline.micro_batches;
  out << std::fixed << std::setprecision(3) << "pipeline / plain (same threads per stage): "
      << r.pipeline.samples_per_s / r.baseline.samples_per_s << "x (ideal K*M/(M+K-1) = " << K * M / (M + K - 1)
      << "x); pipeline / plain (all cores): " << r.pipeline.samples_per_s / r.baseline_all_cores.samples_per_s
      << "x; measured bubble " << r.pipeline.bubble << " (fill-drain " << (K - 1) / (M + K - 1) << ")\n";
  const BenchPrediction& p = r.prediction;
  std::vector<std::string> in_flight;
  for (int n : p.peak_in_flight) in_flight.push_back(std::to_string(n));
  out << std::setprecision(2) << "step " << p.measured_step_s * 1e3 << " ms measured; simulated from its measured op costs "
      << p.simulated_step_s * 1e3 << " ms (" << std::showpos << 100 * (p.simulated_step_s / p.measured_step_s - 1)
      << std::noshowpos << "%); from profiled layer costs " << p.profiled_step_s * 1e3 << " ms (" << std::showpos
      << 100 * (p.profiled_step_s / p.measured_step_s - 1) << std::noshowpos << "%); peak in-flight micro-batches "
      << join(in_flight, "/") << "\n";
  out << "peak tensor memory in a step: plain " << p.baseline_peak_tensor_bytes / (1024.0 * 1024.0)
      << " MiB, pipeline " << p.pipeline_peak_tensor_bytes / (1024.0 * 1024.0) << " MiB (all stages)\n";
}

}  // namespace pipetrain::pipeline
