#include "planner/plan.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "common/error.h"
#include "common/stats.h"
#include "common/strings.h"

namespace pipetrain::planner {

using namespace ::pipetrain::job;  // the run layer below: configs and jobs

namespace {

int virtual_stages(const Config& c) { return c.pipeline.stages * c.pipeline.chunks; }

std::string bytes_text(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::abs(b) >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return buf;
}

}  // namespace

bool defers(const profiler::Profile& p, size_t i) {
  return i < p.deferred_bytes.size() && i < p.deferred_backward_ms.size() && p.deferred_bytes[i] > 0;
}

namespace {
// Deferring, what layers [first, last) stash: every micro-batch's, held to the end of the step,
// and the largest layer's alone (at the flush its pieces are concatenated beside the rest).
struct Stash {
  int64_t all = 0, largest = 0;
  int64_t peak() const { return all + largest; }
};
Stash stash_of(const profiler::Profile& p, int first, int last, int micro_batches) {
  Stash s;
  for (int i = first; i < last; ++i)
    if (defers(p, i)) s.all += micro_batches * p.deferred_bytes[i], s.largest = std::max(s.largest, micro_batches * p.deferred_bytes[i]);
  return s;
}
}  // namespace

bool any_deferred(const profiler::Profile& p) {
  for (size_t i = 0; i < p.layers.size(); ++i)
    if (defers(p, i)) return true;
  return false;
}

schedule::Costs schedule_costs(const profiler::Profile& p, const partitioner::Balance& balance,
                               const schedule::Schedule& s, Recompute recompute, const profiler::Profile* deferred) {
  const int V = s.virtual_stages();
  schedule::Costs c = schedule::Costs::uniform(V, 0, 0, 0);
  const auto off = partitioner::offsets(balance);
  const bool split = schedule::splits_backward(s.kind);
  auto defer = [&](int i) { return deferred && defers(p, i) && static_cast<size_t>(i) < deferred->flush_ms.size(); };
  // A layer's fused backward, and what deferring takes out of its W.
  auto fused = [&](int i) { return defer(i) ? p.deferred_backward_ms[i] : p.layers[i].backward_ms; };
  auto weight = [&](int i) {
    return defer(i) ? std::max(0.0, p.backward_weight_ms[i] - (p.layers[i].backward_ms - fused(i))) : p.backward_weight_ms[i];
  };
  std::vector<double> flush(s.stages, 0.0);
  for (int v = 0; v < V; ++v) {
    for (int i = off[v]; i < off[v + 1]; ++i) {
      c.forward[v] += p.layers[i].forward_ms;
      c.recompute[v] += p.layers[i].forward_ms;
      if (split) {
        c.backward_input[v] += p.backward_input_ms[i];
        c.backward_weight[v] += weight(i);
      } else {
        c.backward_input[v] += fused(i);
      }
      if (defer(i)) flush[s.device_of(v)] += deferred->flush_ms[i];
    }
    if (split && v == 0) {  // the first stage's input needs no gradient: W is its whole backward
      c.backward_weight[v] = 0;
      for (int i = off[0]; i < off[1]; ++i) c.backward_weight[v] += fused(i);
      c.backward_input[v] = 0;
    }
    c.activation_bytes[v] = static_cast<double>(p.layers[off[v + 1] - 1].activation_bytes);
    c.saved_bytes.push_back(0);
    for (int i = off[v]; i < off[v + 1]; ++i) c.saved_bytes[v] += static_cast<double>(p.layers[i].saved_bytes);
    if (split && !p.awaiting_weight_bytes.empty()) {
      c.awaiting_weight_bytes.resize(V, 0.0);
      if (v > 0)  // the first stage's W is its whole backward: nothing waits between
        for (int i = off[v]; i < off[v + 1]; ++i)
          c.awaiting_weight_bytes[v] += static_cast<double>(p.awaiting_weight_bytes[i]);
    }
  }
  if (!p.optimizer_ms.empty()) {
    c.finish_ms.assign(s.stages, 0.0);
    for (int v = 0; v < V; ++v)
      for (int i = off[v]; i < off[v + 1]; ++i) c.finish_ms[s.device_of(v)] += p.optimizer_ms[i];
  }
  if (deferred) c.tail_ms = flush;  // each device's flush right after its own list
  c.recomputed.assign(s.micro_batches, false);
  for (int m = 0; m < s.micro_batches; ++m)
    c.recomputed[m] = recompute == Recompute::Always ||
                      (recompute == Recompute::ExceptLast && m != s.micro_batches - 1);
  return c;
}

profiler::Profile profile_of(std::vector<partitioner::LayerCost> layers) {
  profiler::Profile p;
  for (const auto& l : layers) {  // without a measured split, assume B and W halve the backward
    const bool given = l.backward_input_ms >= 0;
    p.backward_input_ms.push_back(given ? l.backward_input_ms : l.backward_ms / 2);
    p.backward_weight_ms.push_back(given ? l.backward_weight_ms : l.backward_ms / 2);
  }
  p.layers = std::move(layers);
  return p;
}

void apply_speeds(schedule::Costs& costs, const schedule::Schedule& s, const std::vector<double>& speeds) {
  if (speeds.empty()) return;
  for (int v = 0; v < s.virtual_stages(); ++v) {
    const double speed = speeds.at(s.device_of(v));
    costs.forward[v] /= speed, costs.backward_input[v] /= speed;
    costs.backward_weight[v] /= speed, costs.recompute[v] /= speed;
  }
  for (size_t d = 0; d < costs.tail_ms.size(); ++d) costs.tail_ms[d] /= speeds.at(d);  // a flush computes too
}

void add_reductions(schedule::Costs& costs, const profiler::Profile& p, const partitioner::Balance& balance,
                    const schedule::Schedule& s, const DataParallelPlan& dp) {
  if (dp.copies < 2) return;
  const auto off = partitioner::offsets(balance);
  const int V = s.virtual_stages();
  costs.reduce_ms.assign(V, 0.0);
  if (costs.finish_ms.empty()) costs.finish_ms.assign(s.stages, 0.0);
  for (int v = 0; v < V; ++v) {
    double bytes = 0, optimizer_ms = 0;
    for (int i = off[v]; i < off[v + 1]; ++i) {
      bytes += static_cast<double>(p.layers[i].param_bytes);
      if (!p.optimizer_ms.empty()) optimizer_ms += p.optimizer_ms[i];
    }
    if (bytes == 0) continue;  // no parameters: nothing to reduce
    const double speed = dp.link_speed.empty() ? 1.0 : dp.link_speed.at(s.device_of(v));
    if (!dp.sharded) {
      costs.reduce_ms[v] = dp.link.all_reduce.time_ms(bytes, speed);
      continue;
    }
    costs.reduce_ms[v] = dp.link.shard_reduce().time_ms(bytes, speed);
    double& finish = costs.finish_ms[s.device_of(v)];
    finish += dp.link.all_gather.time_ms(bytes, speed) - optimizer_ms + optimizer_ms / dp.copies;
  }
}

void add_straggler_wait(schedule::Costs& costs, const schedule::Schedule& s, double share) {
  if (share <= 0 || costs.reduce_ms.empty()) return;
  const int V = s.virtual_stages();
  std::vector<double> compute(s.stages, 0.0);
  std::vector<int> chunks(s.stages, 0);
  for (int v = 0; v < V; ++v) {
    const int d = s.device_of(v);
    compute[d] += s.micro_batches * (costs.forward[v] + costs.backward_input[v] + costs.backward_weight[v]);
    ++chunks[d];
  }
  for (int v = 0; v < V; ++v) costs.reduce_ms[v] += share * compute[s.device_of(v)] / chunks[s.device_of(v)];
}

std::vector<double> device_peak_bytes(const profiler::Profile& p, const partitioner::Balance& balance,
                                      const schedule::Schedule& s, const schedule::Simulation& sim, Recompute recompute,
                                      double state_factor, bool deferred) {
  const auto off = partitioner::offsets(balance);
  std::vector<double> params(s.stages, 0.0), rebuilt(s.stages, 0.0), workspace(s.stages, 0.0), peak(s.stages);
  std::vector<Stash> stash(s.stages);  // deferred weight gradients: the device's chunks together
  for (int vs = 0; vs < s.virtual_stages(); ++vs) {
    const int d = s.device_of(vs);
    double saved = 0;
    for (int i = off[vs]; i < off[vs + 1]; ++i) {
      params[d] += static_cast<double>(p.layers[i].param_bytes);
      saved += static_cast<double>(p.layers[i].saved_bytes);
      workspace[d] = std::max(workspace[d], static_cast<double>(p.layers[i].workspace_bytes));
    }
    if (deferred) {
      const Stash chunk = stash_of(p, off[vs], off[vs + 1], s.micro_batches);
      stash[d].all += chunk.all, stash[d].largest = std::max(stash[d].largest, chunk.largest);
    }
    if (recompute != Recompute::Never) rebuilt[d] = std::max(rebuilt[d], saved);
  }
  // One layer runs at a time on a device: its largest workspace comes on top of what is held.
  for (int d = 0; d < s.stages; ++d)
    peak[d] = params[d] * (1 + state_factor) + sim.peak_memory.at(d) + rebuilt[d] + workspace[d] +
              static_cast<double>(stash[d].peak());
  return peak;
}

profiler::Profile whole_batch_profile(const Job& job, int repeat) {
  const int D = job.config.pipeline.data_parallel;
  return profile_job(job, repeat, (job.config.data.batch_size + D - 1) / D);
}

profiler::ReduceLink reduce_link(int copies, const partitioner::CostFile* file) {
  if (copies < 2) return {};
  if (file && file->bandwidth_gb_s > 0) return profiler::ring_link(copies, file->latency_ms, file->bandwidth_gb_s * 1e6);
  return profiler::measure_reductions(copies);
}

PlanReport make_plan(const Config& c, const PlanOptions& o) {
  Job job = prepare(c);
  PlanReport r;
  const int D = c.pipeline.data_parallel;
  if (!o.costs_path.empty()) {
    const partitioner::CostFile file = partitioner::load_cost_file(o.costs_path);
    r.profile = profile_of(file.layers);
    if (r.profile.layers.size() != job.model.layers->size())
      throw ConfigError(detail::concat(o.costs_path, ": ", r.profile.layers.size(), " layers but the model has ",
                                       job.model.layers->size()));
    Batch b = to_model(job, job.data.train_batch(0, c.data.batch_size, c.train.seed));
    r.profile.input_bytes =
        static_cast<int64_t>(b.input.tensor_split(D, 0)[0].tensor_split(c.pipeline.micro_batches, 0)[0].nbytes());
    r.data_parallel.link = reduce_link(D, &file);
  } else {
    r.profile = profile_job(job, o.repeat);
    r.data_parallel.link = reduce_link(D, nullptr);
    if (c.pipeline.defer_weight_grads && any_deferred(r.profile)) r.whole = whole_batch_profile(job, o.repeat);
  }
  const profiler::Profile* deferred = r.whole.layers.empty() ? nullptr : &r.whole;
  r.data_parallel.copies = D;
  r.data_parallel.sharded = c.train.shard_optimizer && D > 1;
  r.balance = choose_balance(c, job.model.layers, &r.profile);
  const auto recompute = c.pipeline.recompute;
  const auto names = models::layer_names(job.model.layers);
  const auto mem = memory_model(c, r.profile);
  const auto k = constraints(c, &r.profile);
  const auto off = partitioner::offsets(r.balance);
  double bottleneck = 0;
  const schedule::Schedule shape{c.pipeline.schedule, c.pipeline.stages, c.pipeline.micro_batches, c.pipeline.chunks,
                                 {}, schedule::placement_of(c.pipeline.schedule)};
  for (size_t v = 0; v + 1 < off.size(); ++v) {
    StageRow row;
    row.stage = shape.device_of(static_cast<int>(v));
    row.chunk = shape.chunk_of(static_cast<int>(v));
    row.first_layer = names[off[v]];
    row.last_layer = names[off[v + 1] - 1];
    for (int i = off[v]; i < off[v + 1]; ++i) row.params += r.profile.layers[i].param_bytes;
    row.time_ms = partitioner::stage_time(r.profile.layers, off[v], off[v + 1],
                                          k.devices.empty() ? partitioner::Device{} : k.devices[v]);
    row.activation_bytes = r.profile.layers[off[v + 1] - 1].activation_bytes;
    row.peak_bytes = partitioner::stage_memory(r.profile.layers, off[v], off[v + 1], static_cast<int>(v), mem);
    if (deferred) row.peak_bytes += stash_of(r.profile, off[v], off[v + 1], c.pipeline.micro_batches).peak();
    bottleneck = std::max(bottleneck, row.time_ms);
    r.stages.push_back(row);
  }
  for (auto& row : r.stages) row.share = bottleneck > 0 ? row.time_ms / bottleneck : 0;

  // Simulates config `cc` (a schedule, its chunks) on `balance` with the profiled costs.
  // `prof`: the profile to cost it on; `flush`: the whole batch's for deferred weight gradients (or null).
  auto simulate_config = [&](const Config& cc, const partitioner::Balance& balance, const profiler::Profile& prof,
                             const profiler::Profile* flush) {
    ScheduleRow row;
    row.kind = cc.pipeline.schedule;
    row.chunks = cc.pipeline.chunks;
    const auto s = schedule::pipeline_schedule(row.kind, cc.pipeline.stages, cc.pipeline.micro_batches, row.chunks, D);
    auto costs = schedule_costs(prof, balance, s, recompute, flush);
    apply_speeds(costs, s, cc.pipeline.speeds);
    add_reductions(costs, prof, balance, s, r.data_parallel);
    const auto sim = schedule::simulate(s, costs);
    row.step_ms = sim.makespan_ms;
    row.bubble = sim.bubble;
    row.peak_in_flight = sim.peak_in_flight;
    partitioner::MemoryModel m = memory_model(cc, prof);
    const auto bo = partitioner::offsets(balance);
    for (int v = 0; v < s.virtual_stages(); ++v) {
      const int64_t stash = flush ? stash_of(prof, bo[v], bo[v + 1], s.micro_batches).peak() : 0;
      row.peak_bytes = std::max(row.peak_bytes, partitioner::stage_memory(prof.layers, bo[v], bo[v + 1], v, m) + stash);
    }
    return std::make_pair(row, sim);
  };
  auto configured = simulate_config(c, r.balance, r.profile, deferred);
  r.configured = configured.first;
  r.simulation = configured.second;
  if (D > 1) {
    schedule::Costs costs = schedule::Costs::uniform(static_cast<int>(r.stages.size()), 0, 0, 0);
    add_reductions(costs, r.profile, r.balance, shape, r.data_parallel);
    for (size_t v = 0; v < r.stages.size(); ++v) r.stages[v].reduce_ms = costs.reduce_ms[v];
  }
  if (o.compare) {
    // Every schedule with its own balance by the same method, each with the config's chunks
    // where it runs them, else its default.
    for (schedule::Kind kind : schedule::all_kinds()) {
      Config cc = c;
      cc.pipeline.schedule = kind;
      cc.pipeline.chunks = schedule::chunks_for(kind, c.pipeline.chunks);
      try {
        schedule::check_supported(kind, cc.pipeline.stages, cc.pipeline.micro_batches, cc.pipeline.chunks);
        if (virtual_stages(cc) > static_cast<int>(names.size()))
          throw ScheduleError(detail::concat("schedule: ", virtual_stages(cc), " virtual stages but the model has only ",
                                             names.size(), " layers"));
        if (cc.pipeline.balance_method == BalanceMethod::List && virtual_stages(cc) != virtual_stages(c))
          throw ScheduleError(detail::concat("schedule: pipeline.balance lists ", c.pipeline.balance.size(),
                                             " stages; this schedule needs ", virtual_stages(cc)));
        r.compared.push_back(simulate_config(cc, choose_balance(cc, job.model.layers, &r.profile), r.profile, deferred).first);
      } catch (const Error& e) {
        ScheduleRow row;
        row.kind = kind;
        row.chunks = cc.pipeline.chunks;
        row.error = e.what();
        r.compared.push_back(row);
      }
    }
  }
  if (o.compare && o.costs_path.empty() && c.runtime.dtype == DType::Float32) {
    // The configured schedule in each precision, on that precision's own profile and balance
    // (deferred weight gradients: float32 only, as the stages run them).
    for (Precision p : {Precision::FP32, Precision::BF16}) {
      PrecisionRow row;
      row.precision = p;
      if (p == c.train.precision) {
        row.step_ms = r.configured.step_ms, row.bubble = r.configured.bubble;
      } else {
        try {
          Config cc = c;
          cc.train.precision = p;
          const Job other = prepare(cc);
          const profiler::Profile prof = profile_job(other, o.repeat);
          const auto row_sim = simulate_config(cc, choose_balance(cc, other.model.layers, &prof), prof, nullptr).first;
          row.step_ms = row_sim.step_ms, row.bubble = row_sim.bubble;
        } catch (const Error& e) {
          row.error = e.what();
        }
      }
      r.precisions.push_back(row);
    }
  }
  r.summary = detail::concat(c.model.value("family", "?"), " on ", job.data.name, ", ", c.pipeline.stages, " stages",
                             c.pipeline.chunks > 1 ? detail::concat(" x ", c.pipeline.chunks, " chunks") : "",
                             D > 1 ? detail::concat(" x ", D, " data-parallel copies", r.data_parallel.sharded ? " (sharded optimizer)" : "") : "",
                             ", ", c.pipeline.micro_batches, " micro-batches, schedule ", c.pipeline.schedule,
                             ", recompute ", recompute_name(c.pipeline.recompute),
                             deferred ? ", deferred weight gradients" : "", ", balance ", choice_name(c.pipeline.balance_method),
                             ", precision ", precision_name(c.train.precision));
  return r;
}

schedule::TraceTimeline simulated_timeline(const Config& c, const PlanReport& r) {
  return schedule::simulated_timeline(r.simulation, detail::concat("simulated: ", c.pipeline.schedule, ", ", c.pipeline.stages,
                                                                   " stages, ", c.pipeline.micro_batches, " micro-batches"));
}

void print_plan(std::ostream& out, const PlanReport& r) {
  char line[512];
  out << "plan: " << r.summary << "\n";
  out << "balance " << partitioner::to_string(r.balance) << "\n\n";
  std::snprintf(line, sizeof line, "%-5s %-5s %-28s %10s %12s %12s %12s %7s\n", "stage", "chunk", "layers",
                "params", "fwd+bwd ms", "act/mb", "peak mem", "share");
  out << line;
  for (const auto& s : r.stages) {
    const std::string layers = s.first_layer == s.last_layer ? s.first_layer : s.first_layer + " .. " + s.last_layer;
    std::snprintf(line, sizeof line, "%-5d %-5d %-28s %10s %12.3f %12s %12s %6.0f%%\n", s.stage, s.chunk,
                  layers.c_str(), bytes_text(static_cast<double>(s.params)).c_str(), s.time_ms,
                  bytes_text(static_cast<double>(s.activation_bytes)).c_str(),
                  bytes_text(static_cast<double>(s.peak_bytes)).c_str(), 100 * s.share);
    out << line;
  }
  std::snprintf(line, sizeof line, "\npredicted step %.2f ms, bubble %.1f%% (%s)\n", r.configured.step_ms,
                100 * r.configured.bubble, schedule::name(r.configured.kind));
  out << line;
  if (r.data_parallel.copies > 1) {
    const auto& dp = r.data_parallel;
    std::vector<std::string> per_stage;
    for (const auto& s : r.stages) {
      char ms[32];
      std::snprintf(ms, sizeof ms, "%.2f", s.reduce_ms);
      per_stage.push_back(ms);
    }
    double exposed = 0;
    for (double e : r.simulation.exposed_reduce_ms) exposed = std::max(exposed, e);
    const auto& fit = dp.sharded ? dp.link.shard_reduce() : dp.link.all_reduce;
    std::snprintf(line, sizeof line,
                  "data parallel: %d copies%s; %s %.2f GB/s + %.3f ms; reduce ms per stage %s, "
                  "%.2f ms of it outlasts the lists\n",
                  dp.copies, dp.sharded ? ", sharded optimizer" : "",
                  dp.sharded && !dp.link.shard_by_all_reduce ? "reduce-scatter" : "all-reduce",
                  fit.bytes_per_ms / 1e6, fit.latency_ms, join(per_stage, "/").c_str(), exposed);
    out << line;
    if (dp.sharded) {
      std::snprintf(line, sizeof line, "after the optimizer steps its 1/%d: all-gather %.2f GB/s + %.3f ms\n", dp.copies,
                    dp.link.all_gather.bytes_per_ms / 1e6, dp.link.all_gather.latency_ms);
      out << line;
    }
  }
  if (!r.profile.backward_input_ms.empty()) {
    double fused = 0, b = 0, w = 0;
    for (size_t i = 0; i < r.profile.layers.size(); ++i) {
      fused += r.profile.layers[i].backward_ms;
      b += r.profile.backward_input_ms[i];
      w += r.profile.backward_weight_ms[i];
    }
    std::snprintf(line, sizeof line,
                  "backward of one micro-batch through every layer: fused %.3f ms, split B %.3f + W %.3f = %.3f ms (%.2fx)\n",
                  fused, b, w, b + w, fused > 0 ? (b + w) / fused : 0.0);
    out << line;
  }
  if (!r.compared.empty()) {
    std::snprintf(line, sizeof line, "\n%-18s %12s %8s %14s %12s\n", "schedule", "step ms", "bubble",
                  "in flight", "peak mem");
    out << line;
    for (const auto& s : r.compared) {
      if (!s.error.empty()) {
        out << s.kind << ": " << s.error << "\n";
        continue;
      }
      std::vector<std::string> f;
      for (int n : s.peak_in_flight) f.push_back(std::to_string(n));
      std::snprintf(line, sizeof line, "%-18s %12.2f %7.1f%% %14s %12s\n", schedule::name(s.kind), s.step_ms,
                    100 * s.bubble, join(f, "/").c_str(), bytes_text(static_cast<double>(s.peak_bytes)).c_str());
      out << line;
    }
  }
  if (!r.precisions.empty()) {
    double fp32 = 0;
    for (const auto& p : r.precisions)
      if (p.precision == Precision::FP32 && p.error.empty()) fp32 = p.step_ms;
    std::snprintf(line, sizeof line, "\n%-18s %12s %8s %16s\n", "precision", "step ms", "bubble", "speed vs fp32");
    out << line;
    for (const auto& p : r.precisions) {
      if (!p.error.empty()) {
        out << precision_name(p.precision) << ": " << p.error << "\n";
        continue;
      }
      std::snprintf(line, sizeof line, "%-18s %12.2f %7.1f%% %15.2fx\n", precision_name(p.precision), p.step_ms,
                    100 * p.bubble, fp32 > 0 && p.step_ms > 0 ? fp32 / p.step_ms : 0.0);
      out << line;
    }
  }
}

void print_plan_json(std::ostream& out, const PlanReport& r) {
  using nlohmann::json;
  auto fit_json = [](const profiler::LinkFit& f) { return json{{"gb_s", f.bytes_per_ms / 1e6}, {"latency_ms", f.latency_ms}}; };
  auto schedule_json = [](const ScheduleRow& s) {
    json j{{"schedule", schedule::name(s.kind)}, {"chunks", s.chunks}};
    if (!s.error.empty()) {
      j["error"] = s.error;
      return j;
    }
    j["step_ms"] = s.step_ms;
    j["bubble"] = s.bubble;
    j["peak_in_flight"] = s.peak_in_flight;
    j["peak_memory_bytes"] = s.peak_bytes;
    return j;
  };
  json stages = json::array();
  for (const auto& s : r.stages)
    stages.push_back({{"stage", s.stage}, {"chunk", s.chunk}, {"first_layer", s.first_layer},
                      {"last_layer", s.last_layer}, {"param_bytes", s.params}, {"time_ms", s.time_ms},
                      {"activation_bytes", s.activation_bytes}, {"peak_memory_bytes", s.peak_bytes},
                      {"share_of_bottleneck", s.share}, {"reduce_ms", s.reduce_ms}});
  json j{{"summary", r.summary}, {"balance", r.balance}, {"stages", stages},
         {"predicted", schedule_json(r.configured)}};
  if (r.data_parallel.copies > 1)
    j["data_parallel"] = {{"copies", r.data_parallel.copies}, {"sharded_optimizer", r.data_parallel.sharded},
                          {"all_reduce", fit_json(r.data_parallel.link.all_reduce)},
                          {"reduce_scatter", fit_json(r.data_parallel.link.reduce_scatter)},
                          {"all_gather", fit_json(r.data_parallel.link.all_gather)},
                          {"exposed_reduce_ms", r.simulation.exposed_reduce_ms}};
  if (!r.compared.empty()) {
    j["compare"] = json::array();
    for (const auto& s : r.compared) j["compare"].push_back(schedule_json(s));
  }
  if (!r.precisions.empty()) {
    j["precisions"] = json::array();
    for (const auto& p : r.precisions) {
      json row{{"precision", precision_name(p.precision)}};
      if (!p.error.empty()) {
        row["error"] = p.error;
      } else {
        row["step_ms"] = p.step_ms;
        row["bubble"] = p.bubble;
      }
      j["precisions"].push_back(row);
    }
  }
  out << j.dump(2) << "\n";
}

}  // namespace pipetrain::planner
