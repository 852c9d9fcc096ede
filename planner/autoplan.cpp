// The auto-planner's search (autoplan.h).
#include "planner/autoplan.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <thread>
#include <tuple>

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
#include "planner/concurrency.h"
#include "planner/plan.h"

namespace pipetrain::planner {

using namespace ::pipetrain::job;  // the run layer below: configs and jobs

double Candidate::max_peak_bytes() const {
  return peak_bytes.empty() ? 0.0 : *std::max_element(peak_bytes.begin(), peak_bytes.end());
}

namespace {

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

profiler::Profile at_threads(const profiler::Profile& p1, const profiler::Profile& pn, int n, int threads) {
  if (threads == 1 || n <= 1) return p1;
  if (threads == n) return pn;
  // t(T) = t(1) (s + (1 - s) / T); from t(n): s = (t(n) / t(1) - 1 / n) / (1 - 1 / n).
  auto scale = [&](double t1, double tn) {
    if (t1 <= 0) return tn;
    const double s = std::clamp((tn / t1 - 1.0 / n) / (1.0 - 1.0 / n), 0.0, 1.0);
    return t1 * (s + (1 - s) / threads);
  };
  profiler::Profile out = p1;
  for (size_t i = 0; i < out.layers.size() && i < pn.layers.size(); ++i) {
    out.layers[i].forward_ms = scale(p1.layers[i].forward_ms, pn.layers[i].forward_ms);
    out.layers[i].backward_ms = scale(p1.layers[i].backward_ms, pn.layers[i].backward_ms);
  }
  auto each = [&](std::vector<double>& v, const std::vector<double>& vn) {
    for (size_t i = 0; i < v.size() && i < vn.size(); ++i) v[i] = scale(v[i], vn[i]);
  };
  each(out.backward_input_ms, pn.backward_input_ms);
  each(out.backward_weight_ms, pn.backward_weight_ms);
  each(out.optimizer_ms, pn.optimizer_ms);
  each(out.deferred_backward_ms, pn.deferred_backward_ms);
  each(out.flush_ms, pn.flush_ms);
  return out;
}

const Candidate* plain_loop(const SearchResult& r, int cores, Precision precision) {
  for (const Candidate& c : r.fitting)  // fastest first
    if (c.stages == 1 && c.data_parallel == 1 && c.micro_batches == 1 && c.threads == std::max(1, cores) &&
        c.precision == precision)
      return &c;
  return nullptr;
}

namespace {

// One point of the search space before it is costed: the axes a candidate varies.
struct Axes {
  Precision precision = Precision::FP32;
  int D = 1, M = 1, K = 1, T = 1, chunks = 1;
  schedule::Kind kind = schedule::Kind::GPipe;
  bool sharded = false, defer = false;
  BalanceMethod method = BalanceMethod::Uniform;
  Recompute recompute = Recompute::Never;
};

// The thread counts of K x D workers: 1, and the most that fill the cores.
std::vector<int> thread_counts(const SearchSpace& sp, int workers) {
  std::vector<int> out{1};
  if (sp.cores > 0 && sp.cores / workers > 1) out.push_back(sp.cores / workers);
  return out;
}

// Every candidate the search simulates, in its order, as one odometer over the axes (precision,
// copies, micro-batches, stages, threads, schedule, chunks, sharding, balance method,
// recomputation, deferral), the combinations that cannot run left out: a copy's shard needs M
// samples, K x D <= devices, the kind must run K, M and its chunks on no more virtual stages than
// layers, one stage runs gpipe only (every schedule is the plain loop there), one micro-batch does
// not defer (its flush is its W), one copy has no optimizer state to shard.
std::vector<Axes> candidate_space(const SearchSpace& sp) {
  const int max_d = static_cast<int>(std::min<int64_t>(std::min(std::max(1, sp.max_data_parallel), sp.devices), sp.batch));
  const std::vector<bool> flags{false, true};
  const std::vector<size_t> sizes{sp.precisions.size(), static_cast<size_t>(std::max(0, max_d)), sp.micro_batches.size(),
                                  static_cast<size_t>(std::max(0, sp.devices)), 2, sp.schedules.size(), 4, 2,
                                  sp.balances.size(), sp.recompute.size(), sp.defer.size()};
  std::vector<Axes> out;
  if (std::find(sizes.begin(), sizes.end(), size_t{0}) != sizes.end()) return out;
  std::map<std::tuple<schedule::Kind, int, int, int>, bool> supported;
  for (std::vector<size_t> i(sizes.size(), 0);;) {
    Axes a;
    a.precision = sp.precisions[i[0]], a.D = static_cast<int>(i[1]) + 1, a.M = sp.micro_batches[i[2]];
    a.K = static_cast<int>(i[3]) + 1, a.kind = sp.schedules[i[5]], a.sharded = flags[i[7]];
    a.method = sp.balances[i[8]], a.recompute = sp.recompute[i[9]], a.defer = sp.defer[i[10]];
    const std::vector<int> threads = thread_counts(sp, a.K * a.D), chunks = chunk_options(a.kind);
    bool ok = a.M >= 1 && a.M <= sp.batch / a.D && a.K * a.D <= sp.devices && i[4] < threads.size() &&
              i[6] < chunks.size() && (a.D > 1 || !a.sharded) && !(a.defer && a.M == 1) &&
              (a.K > 1 || a.kind == schedule::Kind::GPipe);
    if (ok) {
      a.T = threads[i[4]], a.chunks = chunks[i[6]];
      ok = a.K * a.chunks <= sp.layers;
    }
    if (ok) {
      auto it = supported.find({a.kind, a.K, a.M, a.chunks});
      if (it == supported.end()) {
        bool runs = true;
        try {
          schedule::check_supported(a.kind, a.K, a.M, a.chunks);
        } catch (const ScheduleError&) {
          runs = false;
        }
        it = supported.emplace(std::make_tuple(a.kind, a.K, a.M, a.chunks), runs).first;
      }
      ok = it->second;
    }
    if (ok) out.push_back(a);
    size_t axis = sizes.size();  // the odometer: the last axis turns fastest
    while (axis > 0 && ++i[axis - 1] == sizes[axis - 1]) i[--axis] = 0;
    if (axis == 0) return out;
  }
}

// What the search measured before it starts (not search time): the reduction's link and the
// straggler share per copy count, the slowdown per count of busy workers.
struct Measured {
  std::map<int, profiler::ReduceLink> links;
  std::map<int, double> contention, straggler;
};

Measured measure(const SearchSpace& sp) {
  Measured m;
  for (int D = 2; D <= std::max(1, sp.max_data_parallel) && D <= sp.devices && D <= sp.batch; ++D) m.links[D] = sp.link(D);
  for (int w = 2; w <= sp.devices; ++w) m.contention[w] = sp.contention(w);
  for (const auto& [D, link] : m.links) m.straggler[D] = sp.straggler(D);
  return m;
}

// The costs of candidates of one precision, copy count, micro-batch count and thread count: the
// micro-batch's profile at T threads and, where a layer defers, a copy's whole batch's.
struct Costing {
  profiler::Profile micro, whole;
  bool may_defer = false;
};

// `a` as a plan point on `k`: the stages' speeds (the copies' slowest, slowed by the busy
// workers), the balance by its method, the links, and the reduction among the copies.
PlanPoint point_of(const SearchSpace& sp, const Axes& a, const Costing& k, const Measured& m) {
  PlanPoint pt;
  pt.schedule = a.kind, pt.stages = a.K, pt.micro_batches = a.M, pt.chunks = a.chunks;
  pt.recompute = a.recompute, pt.defer = a.defer;
  pt.speeds = stage_speeds(sp.speeds, a.K, a.D);
  if (a.K * a.D > 1) {  // K x D workers compute at once
    const double slow = m.contention.count(a.K * a.D) ? m.contention.at(a.K * a.D) : 1.0;
    if (pt.speeds.empty()) pt.speeds.assign(a.K, 1.0);
    for (double& v : pt.speeds) v /= slow;
  }
  const schedule::Schedule shape{a.kind, a.K, a.M, a.chunks, {}, schedule::placement_of(a.kind)};
  partitioner::Constraints speeds;
  if (!pt.speeds.empty())
    for (int v = 0; v < a.K * a.chunks; ++v) speeds.devices.push_back({pt.speeds.at(shape.device_of(v)), 0});
  pt.balance = balance_by(a.method, k.micro.layers, a.K * a.chunks, speeds);
  pt.latency_ms = sp.latency_ms, pt.bytes_per_ms = sp.bytes_per_ms;
  pt.device_bytes_per_ms = stage_speeds(sp.device_bytes_per_ms, a.K, a.D);  // each stage's: its copies' slowest
  pt.data_parallel.copies = a.D, pt.data_parallel.sharded = a.sharded;
  if (a.D > 1) {
    pt.data_parallel.link = m.links.at(a.D);
    if (!pt.device_bytes_per_ms.empty() && sp.bytes_per_ms > 0)
      for (double bw : pt.device_bytes_per_ms) pt.data_parallel.link_speed.push_back(bw / sp.bytes_per_ms);
    pt.straggler = m.straggler.count(a.D) ? m.straggler.at(a.D) : 0.0;
  }
  pt.state_factor = sp.state_factor(a.precision, a.D, a.sharded);
  pt.ties = sp.ties;
  return pt;
}

Candidate candidate_of(const SearchSpace& sp, const Axes& a, const PlanPoint& pt, const Prediction& p) {
  Candidate c;
  c.stages = a.K, c.micro_batches = a.M, c.chunks = a.chunks, c.schedule = a.kind, c.balance_method = a.method;
  c.recompute = a.recompute, c.precision = a.precision, c.data_parallel = a.D, c.sharded = a.sharded, c.threads = a.T;
  c.defer = a.defer;
  c.balance = pt.balance;
  c.step_ms = p.step_ms;
  c.bubble = p.bubble;
  c.exposed_reduce_ms = p.exposed_reduce_ms;
  c.samples_per_s = c.step_ms > 0 ? static_cast<double>(sp.batch) / (c.step_ms / 1e3) : 0.0;
  c.peak_bytes = p.peak_bytes;
  return c;
}

// Whether every copy of every stage fits its device's limit: copy r of stage d runs on device
// d * D + r, as a rank's device.
bool fits(const SearchSpace& sp, const Candidate& c) {
  if (sp.memory_limit.empty()) return true;
  for (int d = 0; d < c.stages; ++d)
    for (int r = 0; r < c.data_parallel; ++r) {
      const int device = comm::Mesh{c.stages, c.data_parallel}.rank(d, r);
      const double limit = sp.memory_limit.size() == 1 ? sp.memory_limit[0] : sp.memory_limit.at(device);
      if (limit > 0 && c.peak_bytes[d] > limit * (1 - sp.memory_headroom)) return false;
    }
  return true;
}

}  // namespace

SearchResult search_plans(const SearchSpace& sp, const ProfileSource& profile) {
  SearchResult out;
  out.smallest_peak = -1;
  double search_s = 0;
  const int n = std::max(1, sp.cores);
  const Measured measured = measure(sp);
  const bool asks_defer = std::find(sp.defer.begin(), sp.defer.end(), true) != sp.defer.end();
  std::map<std::tuple<int, int, int, int>, Costing> costings;  // by precision, D, M, T
  for (const Axes& a : candidate_space(sp)) {
    auto [it, fresh] = costings.try_emplace({static_cast<int>(a.precision), a.D, a.M, a.T});
    Costing& k = it->second;
    if (fresh) {  // may profile: not search time
      const int64_t shard = (sp.batch + a.D - 1) / a.D;  // the largest copy's samples
      const int64_t rows = (shard + a.M - 1) / a.M;
      const profiler::Profile& p1 = profile(rows, a.precision, 1);
      k.micro = n > 1 ? at_threads(p1, profile(rows, a.precision, n), n, a.T) : p1;
      // Deferring: the flush runs on a copy's whole batch, from its own profile.
      k.may_defer = asks_defer && any_deferred(p1);
      if (k.may_defer) {
        const profiler::Profile& w1 = profile(shard, a.precision, 1);
        k.whole = n > 1 ? at_threads(w1, profile(shard, a.precision, n), n, a.T) : w1;
      }
    }
    if (a.defer && !k.may_defer) continue;
    const auto t0 = std::chrono::steady_clock::now();
    const PlanPoint pt = point_of(sp, a, k, measured);
    Candidate c = candidate_of(sp, a, pt, predict(pt, k.micro, &k.whole));
    ++out.considered;
    if (out.smallest_peak < 0 || c.max_peak_bytes() < out.smallest_peak) out.smallest_peak = c.max_peak_bytes();
    if (fits(sp, c)) out.fitting.push_back(std::move(c));
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

std::string fixed(double x, int digits) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", digits, x);
  return b;
}

std::string describe(const Candidate& c) {
  return detail::concat(c.stages, " stages", c.threads > 1 ? detail::concat(" of ", c.threads, " threads") : "",
                        c.chunks > 1 ? detail::concat(" (", c.chunks, " chunks each)") : "",
                        c.data_parallel > 1 ? detail::concat(" x ", c.data_parallel, " data-parallel copies",
                                                             c.sharded ? " (sharded optimizer)" : "")
                                            : "",
                        ", ", c.micro_batches,
                        " micro-batches, ", c.schedule, ", recompute ", recompute_name(c.recompute),
                        c.defer ? ", deferred weight gradients" : "", ", ", precision_name(c.precision), ", balance ", choice_name(c.balance_method), " ", partitioner::to_string(c.balance));
}


// The space `plan --auto` searches for config `c`: on the cost file `file` when one is named (its
// layers, devices and link), else on this machine (its cores on a CPU, measured contention and
// straggler wait, kept in `measured`); the options' limits and speeds, else the config's.
SearchSpace search_space(const Config& c, const AutoPlanOptions& o, const partitioner::CostFile& file,
                         std::map<int, Concurrency>& measured, AutoPlanReport& r) {
  const bool filed = !o.costs_path.empty();
  SearchSpace sp;
  bool all_cpu = false;  // every stage of the config on the CPU (not known from a cost file)
  if (filed) {
    sp.layers = static_cast<int>(file.layers.size());
    sp.ties = file.ties;
  } else {
    const Job probe = prepare(c);
    sp.ties = tie_costs(probe.model);
    sp.layers = static_cast<int>(probe.model.layers->size());
    // On a CPU the cores are shared out among stages, copies and intra-op threads.
    if (probe.options.devices.empty() || probe.options.devices[0].is_cpu())
      sp.cores = o.cores > 0 ? o.cores : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    // Deferred weight gradients run on CPU stages only: every stage's device must be the CPU.
    all_cpu = std::all_of(probe.options.devices.begin(), probe.options.devices.end(),
                          [](const c10::Device& d) { return d.is_cpu(); });
  }
  if (o.cores > 0 && sp.cores == 0)
    throw ConfigError(detail::concat(option(Option::Cores), ": only CPU plans share out cores (",
                                     filed ? "a cost file's devices are its own" : "the config's stages run on GPUs", ")"));
  r.cores = sp.cores;
  const int file_devices = static_cast<int>(file.devices.size());
  sp.devices = o.devices > 0 ? o.devices
               : file_devices > 0 ? file_devices
               : sp.cores > 0    ? sp.cores
                                 : c.pipeline.stages * c.pipeline.data_parallel;
  if (file_devices > 0 && file_devices != sp.devices)
    throw ConfigError(detail::concat(option(Option::Devices), ": ", sp.devices, " devices, but ", o.costs_path, " describes ", file_devices));
  sp.max_data_parallel = sp.devices;
  sp.batch = c.data.batch_size;
  for (int m = 1; m <= sp.batch && m <= 64; m *= 2) sp.micro_batches.push_back(m);
  sp.schedules = schedule::all_kinds();
  sp.recompute = {Recompute::Never, Recompute::ExceptLast, Recompute::Always};
  if (sp.cores > 0 && all_cpu) sp.defer = {false, true};  // where a layer defers: the search checks
  // A cost file holds the costs of one precision: the config's.
  sp.precisions = {filed ? c.train.precision : Precision::FP32};
  if (!filed && c.runtime.dtype == DType::Float32) sp.precisions.push_back(Precision::BF16);
  sp.balances = {BalanceMethod::Uniform, BalanceMethod::Parameters, BalanceMethod::Time};
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
  if (sp.cores > 0) {
    // Measured at 2, 4, 8, ... workers (at most the devices), in the config's precision; between
    // two measured counts, the slowdown and straggler share of the lower.
    auto nearest = [&](int w) -> const Concurrency& {
      int at = 2;
      while (at * 2 <= w) at *= 2;
      auto it = measured.find(at);
      if (it == measured.end()) {
        it = measured.emplace(at, measure_concurrency(c, c.train.precision, at, std::max(5, o.repeat))).first;
        r.contention.emplace_back(at, it->second.slowdown);
        r.straggler.emplace_back(at, it->second.straggler);
      }
      return it->second;
    };
    sp.contention = [nearest](int w) { return w < 2 ? 1.0 : nearest(w).slowdown; };
    sp.straggler = [nearest](int D) { return D < 2 ? 0.0 : nearest(D).straggler; };
  }
  if (filed) {
    sp.latency_ms = file.latency_ms;
    sp.bytes_per_ms = file.bandwidth_gb_s * 1e6;
    for (const auto& d : file.devices) sp.device_bytes_per_ms.push_back(d.bandwidth_gb_s > 0 ? d.bandwidth_gb_s * 1e6 : sp.bytes_per_ms);
    sp.link = [&file](int D) { return reduce_link(D, &file); };
  } else {
    sp.link = [](int D) { return reduce_link(D, nullptr); };
  }
  return sp;
}

// The winner as a config that runs as written: the explicit balance, not a method to redo;
// written to options.write_config when named.
Config chosen_config(const Config& c, const AutoPlanOptions& o, const SearchSpace& sp, const Candidate& best) {
  nlohmann::json root = c.root;
  auto& pipe = root["pipeline"];
  pipe["stages"] = best.stages;
  pipe["micro_batches"] = best.micro_batches;
  pipe["schedule"] = schedule::name(best.schedule);
  pipe["chunks"] = best.chunks;
  pipe["recompute"] = recompute_name(best.recompute);
  pipe["defer_weight_grads"] = best.defer;
  pipe["balance"] = best.balance;
  pipe["data_parallel"] = best.data_parallel;
  root["train"]["shard_optimizer"] = best.sharded;
  if (sp.cores > 0) root["runtime"]["intra_op_threads"] = best.threads;
  if (!sp.speeds.empty()) pipe["speeds"] = stage_speeds(sp.speeds, best.stages, best.data_parallel);
  else pipe.erase("speeds");
  pipe.erase("memory_limit");
  root["train"]["precision"] = precision_name(best.precision);
  const nlohmann::json model = job::with_precision(c, best.precision).model;  // model.frozen_dtype follows it
  if (model.is_object() && model.contains("frozen_dtype")) root["model"]["frozen_dtype"] = model["frozen_dtype"];
  const Config chosen = parse_config(root, o.write_config.empty() ? "the chosen plan" : o.write_config);
  if (!o.write_config.empty()) {
    try {
      write_file_atomically(o.write_config, root.dump(2) + "\n");
    } catch (const IoError& e) {
      throw ConfigError(option(Option::WriteConfig) + " " + o.write_config + ": " + e.what());
    }
  }
  return chosen;
}

}  // namespace

AutoPlanReport auto_plan(const Config& c, const AutoPlanOptions& o) {
  AutoPlanReport r;
  const bool filed = !o.costs_path.empty();
  partitioner::CostFile file;
  if (filed) {
    file = partitioner::load_cost_file(o.costs_path);
    if (file.micro_batch < 1) partitioner::scaled_to_rows(file, 1, o.costs_path);  // names what is missing
  }
  std::map<int, Concurrency> measured;  // read by the search through sp.contention and sp.straggler
  const SearchSpace sp = search_space(c, o, file, measured, r);
  const auto t0 = std::chrono::steady_clock::now();
  std::map<std::tuple<int64_t, int, int>, profiler::Profile> by_threads;
  r.result = search_plans(sp, [&](int64_t rows, Precision p, int threads) -> const profiler::Profile& {
    auto& prof = by_threads[{rows, static_cast<int>(p), threads}];
    if (!prof.layers.empty()) return prof;
    if (filed) {
      const partitioner::CostFile scaled = partitioner::scaled_to_rows(file, rows, o.costs_path);
      prof = profile_of(scaled.layers);
      prof.input_bytes = scaled.input_bytes;
      prof.micro_batch = rows;
      return prof;
    }
    Config cc = job::with_precision(c, p);
    cc.pipeline.micro_batches = 1, cc.pipeline.data_parallel = 1;
    cc.pipeline.stages = 1, cc.pipeline.chunks = 1, cc.pipeline.schedule = schedule::Kind::GPipe;
    cc.pipeline.balance_method = BalanceMethod::Uniform, cc.pipeline.balance.clear();
    cc.pipeline.speeds.clear(), cc.pipeline.memory_limit.clear();
    if (sp.cores > 0) cc.runtime.intra_op_threads = threads;
    prof = profile_job(prepare(cc), o.repeat, rows);
    return prof;
  });
  r.profile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - r.result.seconds;
  r.chosen = chosen_config(c, o, sp, r.result.fitting.front());
  return r;
}

void print_auto_plan(std::ostream& out, const AutoPlanReport& r, int top) {
  const auto& f = r.result.fitting;
  char line[320];
  std::snprintf(line, sizeof line,
                "plan --auto: %zu plans simulated in %.2f s (profiling %.1f s), %zu fit; the fastest %d:\n\n",
                r.result.considered, r.result.seconds, r.profile_seconds, f.size(), std::min<int>(top, static_cast<int>(f.size())));
  out << line;
  std::snprintf(line, sizeof line, "%-4s %3s %4s %3s %3s %-20s %-12s %-3s %-5s %-10s %10s %9s %7s %12s  %s\n", "rank", "K",
                "D", "T", "M", "schedule", "recompute", "dW", "prec", "balance", "samples/s", "step ms", "bubble", "peak/device", "why");
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
    std::snprintf(line, sizeof line, "%-4d %3d %4s %3d %3d %-20s %-12s %-3s %-5s %-10s %10.1f %9.2f %6.1f%% %12s  %s\n", i + 1,
                  c.stages, copies.c_str(), c.threads, c.micro_batches, kind.c_str(), recompute_name(c.recompute),
                  c.defer ? "yes" : "-", precision_name(c.precision),
                  choice_name(c.balance_method), c.samples_per_s, c.step_ms, 100 * c.bubble, mib(c.max_peak_bytes()).c_str(),
                  why.c_str());
    out << line;
  }
  out << "\nchosen: " << describe(f.front()) << "\n";
  if (r.cores > 0) {
    // Beside the pick: not pipelining at all, the whole batch on every core.
    const Candidate* plain = plain_loop(r.result, r.cores, f.front().precision);
    if (plain == &f.front())
      out << "the plain loop on all " << r.cores << " cores is the pick: no pipeline beats it here\n";
    else if (plain)
      out << detail::concat("the plain loop on all ", r.cores, " cores: ", static_cast<int64_t>(plain->samples_per_s + 0.5),
                            " samples/s predicted; the pick is ", fixed(f.front().samples_per_s / plain->samples_per_s, 2),
                            "x of it\n");
    else
      out << "the plain loop on all " << r.cores << " cores does not fit the memory limit\n";
    std::string measured;
    for (size_t i = 0; i < r.contention.size(); ++i)
      measured += detail::concat(i ? "; " : "", r.contention[i].first, " busy cores: each ",
                                 fixed(r.contention[i].second, 2), "x slower, straggler wait ",
                                 fixed(100 * r.straggler[i].second, 1), "% of a step");
    if (!measured.empty()) out << "measured: " << measured << "\n";
  }
  out << "(K stages x D data-parallel copies, z: optimizer state sharded across the copies; T intra-op threads per stage;\n"
         " dW: weight gradients deferred to one GEMM per step, pipeline.defer_weight_grads)\n";
}

void print_auto_plan_json(std::ostream& out, const AutoPlanReport& r) {
  for (const Candidate& c : r.result.fitting)
    out << nlohmann::json{{"stages", c.stages}, {"data_parallel", c.data_parallel}, {"shard_optimizer", c.sharded},
                          {"threads", c.threads},
                          {"micro_batches", c.micro_batches}, {"chunks", c.chunks},
                          {"schedule", schedule::name(c.schedule)}, {"recompute", recompute_name(c.recompute)},
                          {"defer_weight_grads", c.defer},
                          {"precision", precision_name(c.precision)}, {"balance_method", choice_name(c.balance_method)},
                          {"balance", c.balance}, {"step_ms", c.step_ms}, {"bubble", c.bubble},
                          {"exposed_reduce_ms", c.exposed_reduce_ms},
                          {"samples_per_s", c.samples_per_s}, {"peak_bytes", c.peak_bytes}}
               .dump()
        << "\n";
}

}  // namespace pipetrain::planner
