// The auto-planner's search (autoplan.h).
#include "planner/autoplan.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include "comm/mesh.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "common/option.h"
#include "common/strings.h"
#include "schedule/auto.h"
#include "schedule/schedule.h"
#include "schedule/simulate.h"
#include "job/balance.h"
#include "job/job.h"
#include "planner/plan.h"

namespace pipetrain::planner {

using namespace ::pipetrain::job;  // the run layer below: configs and jobs

double Candidate::max_peak_bytes() const {
  return peak_bytes.empty() ? 0.0 : *std::max_element(peak_bytes.begin(), peak_bytes.end());
}

namespace {

partitioner::Balance balance_for(const std::string& method, const profiler::Profile& p, int V,
                                 const std::vector<double>& speeds_per_vs) {
  if (method == "uniform") return partitioner::uniform(static_cast<int>(p.layers.size()), V);
  if (method == "parameters") {
    std::vector<double> w;
    for (const auto& l : p.layers) w.push_back(static_cast<double>(l.param_bytes));
    return partitioner::by_weights(w, V);
  }
  partitioner::Constraints k;
  if (!speeds_per_vs.empty()) {
    k.devices.resize(V);
    for (int v = 0; v < V; ++v) k.devices[v].speed = speeds_per_vs[v];
  }
  return partitioner::min_max(p.layers, V, k).balance;
}

// The speed (or bandwidth) of each of K stages whose D copies run on devices d * D + r: its
// slowest copy's (every copy waits for the others' reductions). Empty: all alike.
std::vector<double> stage_speeds(const std::vector<double>& device_speeds, int K, int D) {
  if (device_speeds.empty()) return {};
  const comm::Mesh mesh{K, D};
  std::vector<double> out(K);
  for (int d = 0; d < K; ++d) {
    out[d] = device_speeds.at(mesh.rank(d, 0));
    for (int r = 1; r < D; ++r) out[d] = std::min(out[d], device_speeds.at(mesh.rank(d, r)));
  }
  return out;
}

// The chunk counts searched: the kind's only count, or 2 and 4 where it runs several.
std::vector<int> chunk_options(schedule::Kind kind) {
  const schedule::KindInfo& k = schedule::info(kind);
  if (k.min_chunks == k.max_chunks) return {k.min_chunks};
  std::vector<int> out;
  for (int v : {2, 4})
    if (v >= k.min_chunks && v <= k.max_chunks) out.push_back(v);
  return out;
}

}  // namespace

SearchResult search_plans(const SearchSpace& sp,
                          const std::function<const profiler::Profile&(int64_t, Precision)>& profile) {
  SearchResult out;
  out.smallest_peak = -1;
  double search_s = 0;
  auto limit_of = [&](int device) {
    if (sp.memory_limit.empty()) return 0.0;
    return sp.memory_limit.size() == 1 ? sp.memory_limit[0] : sp.memory_limit.at(device);
  };
  std::map<int, profiler::ReduceLink> links;
  for (int D = 1; D <= std::max(1, sp.max_data_parallel) && D <= sp.devices; ++D)
    if (D > 1 && D <= sp.batch) links[D] = sp.link(D);  // may measure: not counted as search time
  for (Precision prec : sp.precisions)
    for (int D = 1; D <= std::max(1, sp.max_data_parallel) && D <= sp.devices && D <= sp.batch; ++D)
      for (int M : sp.micro_batches) {
        const int64_t shard = (sp.batch + D - 1) / D;  // the largest copy's samples
        if (M < 1 || M > sp.batch / D) continue;       // every copy's shard needs M samples
        const profiler::Profile& p = profile((shard + M - 1) / M, prec);  // may profile: not search time
        const auto t0 = std::chrono::steady_clock::now();
        for (int K = 1; K * D <= sp.devices; ++K) {
          const std::vector<double> speeds = stage_speeds(sp.speeds, K, D);
          // Each stage's bandwidth: its copies' slowest device's.
          std::vector<double> stage_bw = stage_speeds(sp.device_bytes_per_ms, K, D), link_speed;
          if (!stage_bw.empty() && sp.bytes_per_ms > 0)
            for (double bw : stage_bw) link_speed.push_back(bw / sp.bytes_per_ms);
          for (schedule::Kind kind : sp.schedules)
            for (int v : chunk_options(kind)) {
              try {
                schedule::check_supported(kind, K, M, v);
              } catch (const ScheduleError&) {
                continue;
              }
              const int V = K * v;
              if (V > sp.layers || (K == 1 && kind != schedule::Kind::GPipe)) continue;  // one stage: every schedule is the plain loop
              const schedule::Schedule s = schedule::pipeline_schedule(kind, K, M, v, D);  // what train runs
              for (bool sharded : D > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false})
                for (const std::string& method : sp.balances)
                  for (Recompute rc : sp.recompute) {
                    schedule::Schedule shape{kind, K, M, v, {}, schedule::placement_of(kind)};
                    std::vector<double> speed_vs;
                    if (!speeds.empty())
                      for (int vs = 0; vs < V; ++vs) speed_vs.push_back(speeds.at(shape.device_of(vs)));
                    Candidate c;
                    c.stages = K, c.micro_batches = M, c.chunks = v, c.schedule = kind, c.balance_method = method;
                    c.recompute = rc, c.precision = prec, c.data_parallel = D, c.sharded = sharded;
                    c.balance = balance_for(method, p, V, speed_vs);
                    schedule::Costs costs = schedule_costs(p, c.balance, s, rc);
                    apply_speeds(costs, s, speeds);
                    costs.latency_ms = sp.latency_ms, costs.bytes_per_ms = sp.bytes_per_ms;
                    costs.device_bytes_per_ms = stage_bw;
                    if (D > 1) add_reductions(costs, p, c.balance, s, {D, sharded, links.at(D), link_speed});
                    const schedule::Simulation sim = schedule::simulate(s, costs);
                    c.step_ms = sim.makespan_ms;
                    c.bubble = sim.bubble;
                    for (double e : sim.exposed_reduce_ms) c.exposed_reduce_ms = std::max(c.exposed_reduce_ms, e);
                    c.samples_per_s = c.step_ms > 0 ? static_cast<double>(sp.batch) / (c.step_ms / 1e3) : 0.0;
                    c.peak_bytes = device_peak_bytes(p, c.balance, s, sim, rc, sp.state_factor(prec, D, sharded));
                    bool fits = true;
                    for (int d = 0; d < K; ++d) {
                      // Copy r of device d runs on device d * D + r, as a rank's device: each
                      // copy is held to that device's limit.
                      for (int r = 0; r < D; ++r) {
                        const double limit = limit_of(comm::Mesh{K, D}.rank(d, r));
                        if (limit > 0 && c.peak_bytes[d] > limit * (1 - sp.memory_headroom)) fits = false;
                      }
                    }
                    ++out.considered;
                    if (out.smallest_peak < 0 || c.max_peak_bytes() < out.smallest_peak) out.smallest_peak = c.max_peak_bytes();
                    if (fits) out.fitting.push_back(std::move(c));
                  }
            }
        }
        search_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
  out.seconds = search_s;
  if (out.fitting.empty())
    throw ConfigError(detail::concat("plan --auto: no plan of the ", out.considered, " considered fits the memory limit; ",
                                     "the smallest needs ", static_cast<int64_t>(std::ceil(out.smallest_peak)),
                                     " bytes on its fullest device",
                                     sp.memory_headroom > 0
                                         ? detail::concat(", a limit of ",
                                                          static_cast<int64_t>(std::ceil(out.smallest_peak / (1 - sp.memory_headroom))),
                                                          " with ", sp.memory_headroom * 100, "% headroom")
                                         : std::string()));
  std::stable_sort(out.fitting.begin(), out.fitting.end(),
                   [](const Candidate& a, const Candidate& b) {  // at equal speed, the least memory
                     return a.step_ms != b.step_ms ? a.step_ms < b.step_ms : a.max_peak_bytes() < b.max_peak_bytes();
                   });
  return out;
}

namespace {

std::string mib(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1 << 20));
  return buf;
}

std::string describe(const Candidate& c) {
  return detail::concat(c.stages, " stages", c.chunks > 1 ? detail::concat(" (", c.chunks, " chunks each)") : "",
                        c.data_parallel > 1 ? detail::concat(" x ", c.data_parallel, " data-parallel copies",
                                                             c.sharded ? " (sharded optimizer)" : "")
                                            : "",
                        ", ", c.micro_batches,
                        " micro-batches, ", c.schedule, ", recompute ", recompute_name(c.recompute), ", ",
                        precision_name(c.precision), ", balance ", c.balance_method, " ", partitioner::to_string(c.balance));
}

}  // namespace

AutoPlanReport auto_plan(const Config& c, const AutoPlanOptions& o) {
  AutoPlanReport r;
  const bool filed = !o.costs_path.empty();
  partitioner::CostFile file;
  SearchSpace sp;
  if (filed) {
    file = partitioner::load_cost_file(o.costs_path);
    if (file.micro_batch < 1) partitioner::scaled_to_rows(file, 1, o.costs_path);  // names what is missing
    sp.layers = static_cast<int>(file.layers.size());
  } else {
    sp.layers = static_cast<int>(prepare(c).model.layers->size());
  }
  const int file_devices = static_cast<int>(file.devices.size());
  sp.devices = o.devices > 0 ? o.devices : file_devices > 0 ? file_devices : c.pipeline.stages * c.pipeline.data_parallel;
  if (file_devices > 0 && file_devices != sp.devices)
    throw ConfigError(detail::concat(option(Option::Devices), ": ", sp.devices, " devices, but ", o.costs_path, " describes ", file_devices));
  sp.max_data_parallel = sp.devices;
  sp.batch = c.data.batch_size;
  for (int m = 1; m <= sp.batch && m <= 64; m *= 2) sp.micro_batches.push_back(m);
  sp.schedules = schedule::all_kinds();
  sp.recompute = {Recompute::Never, Recompute::ExceptLast, Recompute::Always};
  // A cost file holds the costs of one precision: the config's.
  sp.precisions = {filed ? c.train.precision : Precision::FP32};
  if (!filed && c.runtime.dtype == "float32") sp.precisions.push_back(Precision::BF16);
  sp.balances = {"uniform", "parameters", "time"};
  sp.memory_headroom = o.memory_headroom;
  if (!o.memory_limit.empty()) sp.memory_limit = o.memory_limit;
  else if (!c.pipeline.memory_limit.empty() && c.pipeline.stages == sp.devices)  // the config's, per stage
    for (int64_t b : c.pipeline.memory_limit) sp.memory_limit.push_back(static_cast<double>(b));
  if (sp.memory_limit.size() > 1 && static_cast<int>(sp.memory_limit.size()) != sp.devices)
    throw ConfigError(detail::concat(option(Option::MemoryLimit), ": ", sp.memory_limit.size(), " limits for ", sp.devices, " devices"));
  if (!o.speeds.empty()) sp.speeds = o.speeds;
  else if (file_devices > 0)
    for (const auto& d : file.devices) sp.speeds.push_back(d.speed);
  else if (c.pipeline.stages == sp.devices) sp.speeds = c.pipeline.speeds;
  if (!sp.speeds.empty() && static_cast<int>(sp.speeds.size()) != sp.devices)
    throw ConfigError(detail::concat(option(Option::Speeds), ": ", sp.speeds.size(), " speeds for ", sp.devices, " devices"));
  sp.state_factor = [&](Precision p, int D, bool sharded) { return state_factor(c.optimizer, p, D, sharded); };
  if (filed) {
    sp.latency_ms = file.latency_ms;
    sp.bytes_per_ms = file.bandwidth_gb_s * 1e6;
    for (const auto& d : file.devices) sp.device_bytes_per_ms.push_back(d.bandwidth_gb_s > 0 ? d.bandwidth_gb_s * 1e6 : sp.bytes_per_ms);
    sp.link = [&file](int D) { return reduce_link(D, &file); };
  } else {
    sp.link = [](int D) { return reduce_link(D, nullptr); };
  }
  std::map<std::pair<int64_t, int>, profiler::Profile> profiles;
  const auto t0 = std::chrono::steady_clock::now();
  r.result = search_plans(sp, [&](int64_t rows, Precision p) -> const profiler::Profile& {
    auto& prof = profiles[{rows, static_cast<int>(p)}];
    if (!prof.layers.empty()) return prof;
    if (filed) {
      const partitioner::CostFile scaled = partitioner::scaled_to_rows(file, rows, o.costs_path);
      prof = profile_of(scaled.layers);
      prof.input_bytes = scaled.input_bytes;
      prof.micro_batch = rows;
      return prof;
    }
    Config cc = c;
    cc.pipeline.micro_batches = 1, cc.pipeline.data_parallel = 1;
    cc.train.precision = p;
    cc.pipeline.stages = 1, cc.pipeline.chunks = 1, cc.pipeline.schedule = schedule::Kind::GPipe;
    cc.pipeline.balance_method = "uniform", cc.pipeline.balance.clear();
    cc.pipeline.speeds.clear(), cc.pipeline.memory_limit.clear();
    prof = profile_job(prepare(cc), o.repeat, rows);
    return prof;
  });
  r.profile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - r.result.seconds;
  // The winner as a config that runs as written: the explicit balance, not a method to redo.
  const Candidate& best = r.result.fitting.front();
  nlohmann::json root = c.root;
  auto& pipe = root["pipeline"];
  pipe["stages"] = best.stages;
  pipe["micro_batches"] = best.micro_batches;
  pipe["schedule"] = schedule::name(best.schedule);
  pipe["chunks"] = best.chunks;
  pipe["recompute"] = recompute_name(best.recompute);
  pipe["balance"] = best.balance;
  pipe["data_parallel"] = best.data_parallel;
  root["train"]["shard_optimizer"] = best.sharded;
  if (!sp.speeds.empty()) pipe["speeds"] = stage_speeds(sp.speeds, best.stages, best.data_parallel);
  else pipe.erase("speeds");
  pipe.erase("memory_limit");
  root["train"]["precision"] = precision_name(best.precision);
  r.chosen = parse_config(root, o.write_config.empty() ? "the chosen plan" : o.write_config);
  if (!o.write_config.empty()) {
    try {
      write_file_atomically(o.write_config, root.dump(2) + "\n");
    } catch (const IoError& e) {
      throw ConfigError(option(Option::WriteConfig) + " " + o.write_config + ": " + e.what());
    }
  }
  return r;
}

void print_auto_plan(std::ostream& out, const AutoPlanReport& r, int top) {
  const auto& f = r.result.fitting;
  char line[320];
  std::snprintf(line, sizeof line,
                "plan --auto: %zu plans simulated in %.2f s (profiling %.1f s), %zu fit; the fastest %d:\n\n",
                r.result.considered, r.result.seconds, r.profile_seconds, f.size(), std::min<int>(top, static_cast<int>(f.size())));
  out << line;
  std::snprintf(line, sizeof line, "%-4s %3s %4s %3s %-20s %-12s %-5s %-10s %10s %9s %7s %12s  %s\n", "rank", "K", "D",
                "M", "schedule", "recompute", "prec", "balance", "samples/s", "step ms", "bubble", "peak/device", "why");
  out << line;
  for (int i = 0; i < top && i < static_cast<int>(f.size()); ++i) {
    const Candidate& c = f[i];
    std::string why;
    auto pct = [](double x) {
      char b[32];
      std::snprintf(b, sizeof b, "%.1f%%", 100 * x);
      return std::string(b);
    };
    if (i == 0) why = f.size() > 1 ? pct(f[1].step_ms / c.step_ms - 1) + " faster than the next" : "the only plan that fits";
    else why = pct(c.step_ms / f[0].step_ms - 1) + " slower";
    if (c.bubble < f[0].bubble && i > 0) why += ", less bubble";
    if (c.max_peak_bytes() < f[0].max_peak_bytes() && i > 0) why += ", less memory";
    const std::string kind = c.chunks > 1 ? detail::concat(c.schedule, " x", c.chunks) : schedule::name(c.schedule);
    const std::string copies = detail::concat(c.data_parallel, c.sharded ? "z" : "");
    std::snprintf(line, sizeof line, "%-4d %3d %4s %3d %-20s %-12s %-5s %-10s %10.1f %9.2f %6.1f%% %12s  %s\n", i + 1,
                  c.stages, copies.c_str(), c.micro_batches, kind.c_str(), recompute_name(c.recompute), precision_name(c.precision),
                  c.balance_method.c_str(), c.samples_per_s, c.step_ms, 100 * c.bubble, mib(c.max_peak_bytes()).c_str(),
                  why.c_str());
    out << line;
  }
  out << "\nchosen: " << describe(f.front()) << "\n";
  if (std::any_of(f.begin(), f.begin() + std::min<size_t>(f.size(), top), [](const Candidate& c) { return c.data_parallel > 1; }))
    out << "(K stages x D data-parallel copies, z: optimizer state sharded across the copies)\n";
}

void print_auto_plan_json(std::ostream& out, const AutoPlanReport& r) {
  for (const Candidate& c : r.result.fitting)
    out << nlohmann::json{{"stages", c.stages}, {"data_parallel", c.data_parallel}, {"shard_optimizer", c.sharded},
                          {"micro_batches", c.micro_batches}, {"chunks", c.chunks},
                          {"schedule", schedule::name(c.schedule)}, {"recompute", recompute_name(c.recompute)},
                          {"precision", precision_name(c.precision)}, {"balance_method", c.balance_method},
                          {"balance", c.balance}, {"step_ms", c.step_ms}, {"bubble", c.bubble},
                          {"exposed_reduce_ms", c.exposed_reduce_ms},
                          {"samples_per_s", c.samples_per_s}, {"peak_bytes", c.peak_bytes}}
               .dump()
        << "\n";
}

}  // namespace pipetrain::planner
