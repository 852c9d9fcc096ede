// What-if tools (whatif.h).
#include "planner/whatif.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/option.h"
#include "common/strings.h"
#include "partitioner/partition.h"
#include "schedule/auto.h"
#include "schedule/trace.h"
#include "planner/plan.h"

namespace pipetrain::planner {

using namespace ::pipetrain::job;  // the run layer below: configs and jobs

partitioner::CostFile transformer_costs(const TransformerShape& t) {
  auto positive = [](Option o, double v) {
    if (!(v > 0) || !std::isfinite(v)) throw ConfigError(detail::concat(option(o), " must be a positive number, got ", v));
  };
  positive(Option::Layers, t.layers), positive(Option::Hidden, t.hidden), positive(Option::Seq, t.seq);
  positive(Option::Heads, t.heads), positive(Option::Vocab, t.vocab), positive(Option::MicroBatch, t.micro_batch);
  positive(Option::DeviceTflops, t.device_tflops), positive(Option::Efficiency, t.efficiency);
  positive(Option::Bandwidth, t.bandwidth_gb_s), positive(Option::BytesPerValue, t.bytes_per_value);
  if (t.efficiency > 1) throw ConfigError(detail::concat(option(Option::Efficiency), " is a share of the peak, at most 1, got ", t.efficiency));
  if (t.latency_ms < 0) throw ConfigError(detail::concat(option(Option::LatencyMs), " must be >= 0, got ", t.latency_ms));
  if (t.hidden % t.heads != 0)
    throw ConfigError(detail::concat(option(Option::Hidden), " (", t.hidden, ") must be a multiple of ", option(Option::Heads), " (", t.heads, ")"));
  const double b = t.micro_batch, s = t.seq, h = t.hidden, a = t.heads, V = t.vocab, d = t.bytes_per_value;
  const double flop_per_ms = t.device_tflops * 1e12 * t.efficiency / 1e3;
  auto ms = [&](double flop) { return flop / flop_per_ms; };
  partitioner::CostFile f;
  f.bandwidth_gb_s = t.bandwidth_gb_s;
  f.latency_ms = t.latency_ms;
  f.split_given = true;
  f.micro_batch = t.micro_batch;
  f.input_bytes = static_cast<int64_t>(b * s * 8);  // int64 token ids
  partitioner::LayerCost embed;
  embed.name = "embed";
  embed.param_bytes = static_cast<int64_t>(4 * V * h);
  embed.activation_bytes = static_cast<int64_t>(b * s * h * d);
  embed.backward_input_ms = embed.backward_weight_ms = 0;
  f.layers.push_back(embed);
  for (int i = 0; i < t.layers; ++i) {
    partitioner::LayerCost blk;
    blk.name = detail::concat("block", i);  // the names and order of the gpt family's layers
    blk.forward_ms = ms(24 * b * s * h * h + 4 * b * s * s * h);
    blk.backward_input_ms = ms(24 * b * s * h * h + 8 * b * s * s * h);
    blk.backward_weight_ms = ms(24 * b * s * h * h);
    blk.backward_ms = blk.backward_input_ms + blk.backward_weight_ms;
    blk.param_bytes = static_cast<int64_t>(4 * (12 * h * h + 13 * h));
    blk.activation_bytes = static_cast<int64_t>(b * s * h * d);
    blk.saved_bytes = static_cast<int64_t>(s * b * h * (34 + 5 * a * s / h) * d / 2);
    f.layers.push_back(blk);
  }
  partitioner::LayerCost norm;  // the final layer norm: memory-bound, no time at this scale
  norm.name = "norm";
  norm.param_bytes = static_cast<int64_t>(4 * 2 * h);
  norm.activation_bytes = norm.saved_bytes = static_cast<int64_t>(b * s * h * d);
  norm.backward_input_ms = norm.backward_weight_ms = 0;
  f.layers.push_back(norm);
  partitioner::LayerCost head;
  head.name = "head";
  head.forward_ms = head.backward_input_ms = head.backward_weight_ms = ms(2 * b * s * h * V);
  head.backward_ms = head.backward_input_ms + head.backward_weight_ms;
  head.param_bytes = static_cast<int64_t>(4 * V * h);
  head.activation_bytes = 4;  // the loss
  head.saved_bytes = static_cast<int64_t>(b * s * V * 4 + b * s * h * d);
  f.layers.push_back(head);
  if (t.tie_embeddings) f.ties.push_back({{0, static_cast<int>(f.layers.size()) - 1}, head.param_bytes});
  return f;
}


SimulateReport simulate_cost_file(const SimulateOptions& o) {
  SimulateReport r;
  r.options = o;
  const partitioner::CostFile file = partitioner::load_cost_file(o.costs_path);
  const int chunks = o.chunks > 0 ? o.chunks : schedule::info(o.schedule).default_chunks;
  r.options.chunks = chunks;
  try {
    schedule::check_supported(o.schedule, o.stages, o.micro_batches, chunks);
  } catch (const ScheduleError& e) {
    throw ConfigError(e.what());  // the user's flags
  }
  const int V = o.stages * chunks;
  if (V > static_cast<int>(file.layers.size()))
    throw ConfigError(detail::concat(o.costs_path, ": ", file.layers.size(), " layers cannot fill ", V, " virtual stages"));
  // The file's devices: their speeds in the partition and the step, their bandwidths on the links.
  std::vector<double> speeds;
  if (!file.devices.empty()) {
    if (static_cast<int>(file.devices.size()) != o.stages)
      throw ConfigError(detail::concat(o.costs_path, ": ", file.devices.size(), " devices for ", o.stages, " stages"));
    for (const auto& d : file.devices) speeds.push_back(d.speed);
  }
  const schedule::Schedule layout{o.schedule, o.stages, o.micro_batches, chunks, {}, schedule::placement_of(o.schedule)};
  partitioner::Constraints k;
  for (int v = 0; v < V && !speeds.empty(); ++v) k.devices.push_back({speeds[layout.device_of(v)], 0});
  const partitioner::Plan plan = partitioner::min_max(file.layers, V, k);
  r.balance = plan.balance;
  r.split = file.split_given ? "backward_input_ms and backward_weight_ms from the cost file"
                             : "no backward_input_ms/backward_weight_ms in the cost file: B and W are half of backward_ms each";
  PlanPoint pt;
  pt.schedule = o.schedule, pt.stages = o.stages, pt.micro_batches = o.micro_batches, pt.chunks = chunks;
  pt.recompute = o.recompute;
  pt.balance = r.balance;
  pt.speeds = speeds;
  const double gb_s = o.bandwidth_gb_s >= 0 ? o.bandwidth_gb_s : file.bandwidth_gb_s;
  pt.bytes_per_ms = gb_s * 1e6;
  pt.latency_ms = o.latency_ms >= 0 ? o.latency_ms : file.latency_ms;
  if (!file.devices.empty() && o.bandwidth_gb_s < 0)
    for (const auto& d : file.devices) pt.device_bytes_per_ms.push_back((d.bandwidth_gb_s > 0 ? d.bandwidth_gb_s : gb_s) * 1e6);
  pt.state_factor = o.state_factor;
  pt.ties = file.ties;  // exchanged at the step over the link
  pt.search_on_costs = true;  // zb-auto: searched on the file's costs
  pt.search_memory_limit = o.memory_limit;
  Prediction p = predict(pt, profile_of(file.layers));
  const auto off = partitioner::offsets(r.balance);
  r.param_bytes.assign(o.stages, 0.0);
  for (int v = 0; v < V; ++v)
    for (int i = off[v]; i < off[v + 1]; ++i) r.param_bytes[p.schedule.device_of(v)] += static_cast<double>(file.layers[i].param_bytes);
  r.schedule = std::move(p.schedule);
  r.costs = std::move(p.costs);
  r.simulation = std::move(p.simulation);
  r.peak_bytes = std::move(p.peak_bytes);
  return r;
}

namespace {
std::string gib(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, b >= 1 << 30 ? "%.2f GiB" : "%.1f MiB", b >= 1 << 30 ? b / (1 << 30) : b / (1 << 20));
  return buf;
}
}  // namespace

void print_simulation(std::ostream& out, const SimulateReport& r, bool json) {
  const auto& sim = r.simulation;
  const auto& o = r.options;
  if (json) {
    nlohmann::json stages = nlohmann::json::array();
    for (int d = 0; d < o.stages; ++d)
      stages.push_back({{"stage", d}, {"busy_ms", sim.busy_ms[d]}, {"span_ms", sim.span_ms[d]},
                        {"peak_in_flight", sim.peak_awaiting_weight[d]}, {"peak_activation_bytes", sim.peak_memory[d]},
                        {"param_bytes", r.param_bytes[d]}, {"peak_memory_bytes", r.peak_bytes[d]}});
    nlohmann::json j{{"schedule", schedule::name(o.schedule)}, {"stages", o.stages}, {"micro_batches", o.micro_batches},
                     {"chunks", o.chunks}, {"step_ms", sim.makespan_ms}, {"bubble", sim.bubble},
                     {"balance", r.balance}, {"split", r.split}, {"peak_memory_bytes", r.peak_bytes},
                     {"per_stage", stages}};
    out << j.dump() << "\n";
    return;
  }
  char line[256];
  std::snprintf(line, sizeof line, "simulate: %s, %d stages%s, %d micro-batches, recompute %s\n", schedule::name(o.schedule),
                o.stages, o.chunks > 1 ? detail::concat(" x ", o.chunks, " chunks").c_str() : "", o.micro_batches,
                recompute_name(o.recompute));
  out << line << "costs " << o.costs_path << " (" << r.split << ")\n";
  out << "balance " << partitioner::to_string(r.balance) << "\n\n";
  std::snprintf(line, sizeof line, "%-5s %10s %10s %9s %16s %14s %14s\n", "stage", "busy ms", "span ms", "in flight",
                "peak activations", "parameters", "peak memory");
  out << line;
  for (int d = 0; d < o.stages; ++d) {
    std::snprintf(line, sizeof line, "%-5d %10.2f %10.2f %9d %16s %14s %14s\n", d, sim.busy_ms[d], sim.span_ms[d],
                  sim.peak_awaiting_weight[d], gib(sim.peak_memory[d]).c_str(), gib(r.param_bytes[d]).c_str(),
                  gib(r.peak_bytes[d]).c_str());
    out << line;
  }
  std::snprintf(line, sizeof line, "\nstep %.2f ms, bubble %.1f%%\n", sim.makespan_ms, 100 * sim.bubble);
  out << line;
}

void write_simulation_trace(const std::string& path, const SimulateReport& r) {
  const schedule::TraceTimeline t = schedule::simulated_timeline(
      r.simulation, detail::concat("simulated: ", r.options.schedule, ", ", r.options.stages, " stages, ",
                                   r.options.micro_batches, " micro-batches"));
  std::ofstream out(path);
  if (!out) throw ConfigError(option(Option::Trace) + " " + path + ": cannot write");
  schedule::write_chrome_trace(out, {t});
  if (!out) throw ConfigError(option(Option::Trace) + " " + path + ": write failed");
}

}  // namespace pipetrain::planner
