// What-if tools that need no model and no libtorch: a transformer's costs from its FLOP and byte
// counts (for hardware this machine does not have), and the simulation of a schedule on a cost
// file. `pipetrain costs transformer` and `pipetrain simulate` print them.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "common/recompute.h"
#include "partitioner/cost_file.h"
#include "schedule/simulate.h"

namespace pipetrain::planner {

// A decoder-only transformer and the device it runs on. Per micro-batch of b sequences of s
// tokens, hidden size h, a heads, vocabulary V, d bytes per activation value:
//   block  F = 24bsh² + 4bs²h FLOP, B = 24bsh² + 8bs²h, W = 24bsh² (B and W: the input's and the
//          weights' gradients); parameters 12h² + 13h; it keeps sbh(34 + 5as/h)·d/2 bytes for
//          backward (Korthikanti et al., 2022) and passes on bsh·d bytes;
//   embed: V·h parameters, no time; norm: no time; head: F = B = W = 2bshV, V·h parameters,
//          keeps the float32 logits.
// The layers are named and ordered as the gpt family's (embed, block0.., norm, head), so `plan
// CONFIG --costs` takes the file for a gpt config of the same depth; with tie_embeddings, the
// head and the embedding are one tie of V·h parameters.
// Times are FLOP / (device_tflops · efficiency); parameters count 4 bytes (float32 masters).
struct TransformerShape {
  int layers = 0, hidden = 0, seq = 0, heads = 0, vocab = 0, micro_batch = 1;
  double device_tflops = 400, efficiency = 0.5;
  double bandwidth_gb_s = 50, latency_ms = 0.01;
  int bytes_per_value = 2;
  bool tie_embeddings = false;  // the head tied to the embedding (the file's `ties`)
};

partitioner::CostFile transformer_costs(const TransformerShape& shape);

struct SimulateOptions {
  std::string costs_path;
  schedule::Kind schedule = schedule::Kind::OneFOneB;
  int stages = 1, micro_batches = 1;
  int chunks = 0;                   // 0: the kind's default (1, or 2 for kinds with chunks)
  Recompute recompute = Recompute::Never;
  double memory_limit = 0;          // zb-auto: activation bytes per device; 0: twice 1F1B's peak
  double bandwidth_gb_s = -1;       // override the file's link (negative: keep it)
  double latency_ms = -1;
  double state_factor = 3;          // gradient + optimizer bytes per parameter byte (Adam: 3)
};

struct SimulateReport {
  SimulateOptions options;
  std::vector<int> balance;          // layers per virtual stage (min-max on forward + backward)
  std::string split;                 // where B and W come from
  schedule::Schedule schedule;
  schedule::Costs costs;
  schedule::Simulation simulation;
  std::vector<double> param_bytes;   // per device
  std::vector<double> peak_bytes;    // per device: activations at their peak + parameters, gradients, state
};

SimulateReport simulate_cost_file(const SimulateOptions& options);
void print_simulation(std::ostream& out, const SimulateReport& r, bool json);
void write_simulation_trace(const std::string& path, const SimulateReport& r);

}  // namespace pipetrain::planner
