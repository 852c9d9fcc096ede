#include "planner/plan.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "common/error.h"
#include "common/stats.h"
#include "common/strings.h"
#include "planner/deferral.h"

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

profiler::Profile whole_batch_profile(const Job& job, int repeat) {
  const int D = job.config.pipeline.data_parallel;
  return profile_job(job, repeat, (job.config.data.batch_size + D - 1) / D);
}

PlanPoint config_point(const Config& cc, const partitioner::Balance& balance, const DataParallelPlan& dp, bool defer) {
  PlanPoint pt;
  pt.schedule = cc.pipeline.schedule;
  pt.stages = cc.pipeline.stages, pt.micro_batches = cc.pipeline.micro_batches, pt.chunks = cc.pipeline.chunks;
  pt.recompute = cc.pipeline.recompute;
  pt.defer = defer;
  pt.balance = balance;
  pt.data_parallel = dp;
  pt.speeds = cc.pipeline.speeds;
  pt.state_factor = state_factor(cc.optimizer, cc.train.precision, dp.copies, dp.sharded);
  return pt;
}

std::vector<partitioner::TieCost> tie_costs(const models::Model& model) {
  std::vector<partitioner::TieCost> out;
  for (const models::Tie& tie : model.ties) {
    partitioner::TieCost t;
    for (const models::ParamRef& ref : tie) t.layers.push_back(ref.layer);
    if (!tie.empty())
      if (const at::Tensor* p = model.layers->ptr(tie.front().layer)->named_parameters().find(tie.front().name))
        t.bytes = p->numel() * static_cast<int64_t>(p->element_size());
    out.push_back(std::move(t));
  }
  return out;
}

profiler::ReduceLink reduce_link(int copies, const partitioner::CostFile* file) {
  if (copies < 2) return {};
  if (file && file->bandwidth_gb_s > 0) return profiler::ring_link(copies, file->latency_ms, file->bandwidth_gb_s * 1e6);
  return profiler::measure_reductions(copies);
}

namespace {

// What the configured candidate runs on besides its costs: a cost file's link between stages
// (and per device, when it lists one per stage), else free transfers, as a profile measures none;
// and the ties: a cost file's, else the model's.
struct Links {
  double latency_ms = 0, bytes_per_ms = 0;
  std::vector<double> device_bytes_per_ms;
  std::vector<partitioner::TieCost> ties;
};

// config_point with the links between stages.
PlanPoint point_of(const Config& cc, const partitioner::Balance& balance, const DataParallelPlan& dp, const Links& links,
                   bool defer) {
  PlanPoint pt = config_point(cc, balance, dp, defer);
  pt.ties = links.ties;
  pt.latency_ms = links.latency_ms, pt.bytes_per_ms = links.bytes_per_ms;
  pt.device_bytes_per_ms = links.device_bytes_per_ms;
  return pt;
}

ScheduleRow row_of(const PlanPoint& pt, const Prediction& p) {
  ScheduleRow row;
  row.kind = pt.schedule;
  row.chunks = pt.chunks;
  row.step_ms = p.step_ms;
  row.bubble = p.bubble;
  row.peak_in_flight = p.simulation.peak_in_flight;
  row.device_peak_bytes = p.peak_bytes;
  row.peak_bytes = static_cast<int64_t>(std::llround(p.max_peak_bytes()));
  return row;
}

// The profile the plan is costed on (measured, or the cost file's), the reduction's link, and
// with deferred weight gradients the whole batch's profile.
Links load_costs(const Job& job, const PlanOptions& o, PlanReport& r) {
  const Config& c = job.config;
  const int D = c.pipeline.data_parallel;
  Links links;
  if (o.costs_path.empty()) {
    r.profile = profile_job(job, o.repeat);
    r.data_parallel.link = reduce_link(D, nullptr);
    if (c.pipeline.defer_weight_grads == DeferWeightGrads::On && any_deferred(r.profile))
      r.whole = whole_batch_profile(job, o.repeat);
    links.ties = tie_costs(job.model);
    return links;
  }
  const partitioner::CostFile file = partitioner::load_cost_file(o.costs_path);
  r.profile = profile_of(file.layers);
  if (r.profile.layers.size() != job.model.layers->size())
    throw ConfigError(detail::concat(o.costs_path, ": ", r.profile.layers.size(), " layers but the model has ",
                                     job.model.layers->size()));
  Batch b = to_model(job, job.data.train_batch(0, c.data.batch_size, c.train.seed));
  r.profile.input_bytes =
      static_cast<int64_t>(b.input.tensor_split(D, 0)[0].tensor_split(c.pipeline.micro_batches, 0)[0].nbytes());
  r.data_parallel.link = reduce_link(D, &file);
  links.latency_ms = file.latency_ms;
  links.bytes_per_ms = file.bandwidth_gb_s * 1e6;
  links.ties = file.ties;
  if (static_cast<int>(file.devices.size()) == c.pipeline.stages)
    for (const auto& d : file.devices) links.device_bytes_per_ms.push_back(d.bandwidth_gb_s > 0 ? d.bandwidth_gb_s * 1e6 : links.bytes_per_ms);
  return links;
}

// Per virtual stage: its layers, parameters, time, output, and its device's predicted peak.
std::vector<StageRow> stage_rows(const Config& c, const PlanReport& r, const std::vector<std::string>& names) {
  const auto k = constraints(c, &r.profile);
  const auto off = partitioner::offsets(r.balance);
  const schedule::Schedule shape{c.pipeline.schedule, c.pipeline.stages, c.pipeline.micro_batches, c.pipeline.chunks,
                                 {}, schedule::placement_of(c.pipeline.schedule)};
  std::vector<StageRow> rows;
  double bottleneck = 0;
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
    row.peak_bytes = static_cast<int64_t>(std::llround(r.configured.device_peak_bytes.at(row.stage)));
    if (v < r.prediction.reduce_ms.size()) row.reduce_ms = r.prediction.reduce_ms[v];
    bottleneck = std::max(bottleneck, row.time_ms);
    rows.push_back(row);
  }
  for (auto& row : rows) row.share = bottleneck > 0 ? row.time_ms / bottleneck : 0;
  return rows;
}

// plan --compare: every schedule with its own balance by the same method, each with the
// config's chunks where it runs them, else its default.
std::vector<ScheduleRow> compare_schedules(const Config& c, const Job& job, const PlanReport& r, const Links& links) {
  std::vector<ScheduleRow> out;
  const int layers = static_cast<int>(job.model.layers->size());
  for (schedule::Kind kind : schedule::all_kinds()) {
    Config cc = c;
    cc.pipeline.schedule = kind;
    cc.pipeline.chunks = schedule::chunks_for(kind, c.pipeline.chunks);
    try {
      schedule::check_supported(kind, cc.pipeline.stages, cc.pipeline.micro_batches, cc.pipeline.chunks);
      if (virtual_stages(cc) > layers)
        throw ScheduleError(detail::concat("schedule: ", virtual_stages(cc), " virtual stages but the model has only ",
                                           layers, " layers"));
      if (cc.pipeline.balance_method == BalanceMethod::List && virtual_stages(cc) != virtual_stages(c))
        throw ScheduleError(detail::concat("schedule: pipeline.balance lists ", c.pipeline.balance.size(),
                                           " stages; this schedule needs ", virtual_stages(cc)));
      const PlanPoint pt = point_of(cc, choose_balance(cc, job.model.layers, &r.profile), r.data_parallel, links, !r.whole.layers.empty());
      out.push_back(row_of(pt, predict(pt, r.profile, &r.whole)));
    } catch (const Error& e) {
      ScheduleRow row;
      row.kind = kind;
      row.chunks = cc.pipeline.chunks;
      row.error = e.what();
      out.push_back(row);
    }
  }
  return out;
}

// plan --compare on a float32 model: the configured schedule in each precision, on that
// precision's own profile and balance (deferred weight gradients: float32 only, as the stages run them).
std::vector<PrecisionRow> compare_precisions(const Config& c, const PlanOptions& o, const PlanReport& r, const Links& links) {
  std::vector<PrecisionRow> out;
  for (Precision p : {Precision::FP32, Precision::BF16}) {
    PrecisionRow row;
    row.precision = p;
    if (p == c.train.precision) {
      row.step_ms = r.configured.step_ms, row.bubble = r.configured.bubble;
    } else {
      try {
        Config cc = job::with_precision(c, p);
        const Job other = prepare(cc);
        const profiler::Profile prof = profile_job(other, o.repeat);
        const PlanPoint pt = point_of(cc, choose_balance(cc, other.model.layers, &prof), r.data_parallel, links, false);
        const Prediction pred = predict(pt, prof);
        row.step_ms = pred.step_ms, row.bubble = pred.bubble;
      } catch (const Error& e) {
        row.error = e.what();
      }
    }
    out.push_back(row);
  }
  return out;
}

}  // namespace

namespace {
// What keeping the frozen Linear weights in the precision's type would save, where they are float32
// under a reduced precision.
std::string frozen_hint(const Config& c, const models::Model& m) {
  if (c.train.precision == Precision::FP32 || m.frozen != Precision::FP32) return "";
  int64_t bytes = 0;
  for (const at::Tensor& w : models::frozen_linear_weights(m))
    if (w.scalar_type() == at::kFloat) bytes += static_cast<int64_t>(w.nbytes());
  if (bytes == 0) return "";
  const std::string p = precision_name(c.train.precision);
  return detail::concat(bytes_text(static_cast<double>(bytes)), " of frozen Linear weights in float32 under ", p,
                        "; model.frozen_dtype \"", p, "\" keeps them in half that, with the same steps, and drops the ", p,
                        " copy of them that each micro-batch in flight keeps");
}
}  // namespace

std::string shared_device_hint(const stages::StageDevices& devices, int micro_batches) {
  if (micro_batches <= 2) return "";
  std::map<std::string, std::vector<std::string>> stages_on;  // a GPU's name -> its stages
  for (size_t s = 0; s < devices.per_stage.size(); ++s)
    if (devices.per_stage[s].is_cuda()) stages_on[devices.per_stage[s].str()].push_back(std::to_string(s));
  for (const auto& [gpu, stages] : stages_on) {
    if (stages.size() < 2) continue;
    return detail::concat("stages ", join(stages, ", "), " share ", gpu, ", where they overlap little: each of the ",
                          micro_batches, " micro-batches costs smaller products and a launch of every kernel, and "
                          "buys activation memory only (the 24-layer GPT as 4 stages on one H200: 0.99x the plain loop "
                          "with 2 micro-batches, 0.38x with 8, 0.81x with 8 and pipeline.cuda_graphs; docs/gpu.md)");
  }
  return "";
}

PlanReport make_plan(const Config& c, const PlanOptions& o) {
  Job job = prepare(c);
  PlanReport r;
  const int D = c.pipeline.data_parallel;
  const Links links = load_costs(job, o, r);
  r.data_parallel.copies = D;
  r.data_parallel.sharded = c.train.shard_optimizer && D > 1;
  r.balance = choose_balance(c, job.model.layers, &r.profile);
  // "auto": decided as a run decides it (planner/deferral.h), on this plan's profile and balance.
  if (c.pipeline.defer_weight_grads == DeferWeightGrads::Auto)
    r.deferral = decide_deferral(job, r.balance, r.profile, o.repeat, &r.whole).text();
  const bool deferred = !r.whole.layers.empty();
  r.point = point_of(c, r.balance, r.data_parallel, links, deferred);
  r.prediction = predict(r.point, r.profile, &r.whole);
  r.configured = row_of(r.point, r.prediction);
  r.simulation = r.prediction.simulation;
  r.stages = stage_rows(c, r, models::layer_names(job.model.layers));
  if (o.compare) r.compared = compare_schedules(c, job, r, links);
  r.frozen_hint = frozen_hint(c, job.model);
  r.shared_device_hint = shared_device_hint(job.devices, c.pipeline.micro_batches);
  if (o.compare && o.costs_path.empty() && c.runtime.dtype == DType::Float32) r.precisions = compare_precisions(c, o, r, links);
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
  if (!r.deferral.empty()) out << "weight gradients: " << r.deferral << "\n";
  if (!r.frozen_hint.empty()) out << "frozen weights: " << r.frozen_hint << "\n";
  if (!r.shared_device_hint.empty()) out << "shared device: " << r.shared_device_hint << "\n";
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
         {"predicted", schedule_json(r.configured)}, {"deferred_weight_grads", !r.whole.layers.empty()}};
  if (!r.deferral.empty()) j["deferral"] = r.deferral;
  if (!r.frozen_hint.empty()) j["frozen_hint"] = r.frozen_hint;
  if (!r.shared_device_hint.empty()) j["shared_device_hint"] = r.shared_device_hint;
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
