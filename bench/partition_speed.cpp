// Speed of the exact partitioner (partitioner/partition.h): min_max of 10,000 random layers
// into 64 stages, without and with memory limits, timed by Google Benchmark (which picks the
// iterations; --benchmark_repetitions=N gives medians). Every call must give the first call's
// bottleneck, or the case reports an error and the program exits 1; exactness itself is tested in
// tests/partitioner_test.cpp against brute force and a dynamic program.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "partitioner/partition.h"

using namespace pipetrain::partitioner;
using pipetrain::Recompute;

namespace {

std::vector<LayerCost> random_layers(int n, unsigned seed, bool dominant) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> ms(0.05, 2.0);
  std::uniform_int_distribution<int64_t> bytes(1 << 16, 1 << 24);
  std::vector<LayerCost> layers(n);
  for (int i = 0; i < n; ++i) {
    LayerCost& l = layers[i];
    l.forward_ms = ms(rng);
    l.backward_ms = 2 * l.forward_ms * ms(rng);
    l.param_bytes = bytes(rng);
    l.activation_bytes = bytes(rng) / 4;
    l.saved_bytes = l.activation_bytes + bytes(rng) / 2;
  }
  if (dominant) layers[n / 3].forward_ms = 2000;
  return layers;
}

struct Case {
  const char* name;
  std::vector<LayerCost> layers;
  Constraints constraints;
};

// What the calls of one case have found so far.
struct Check {
  double first_bottleneck = -1;  // from the first call; every later call must match it
  std::string error;             // lives as long as the report that names it
};

// A limit that binds: `slack` times what each stage would hold if memory split evenly.
int64_t even_limit(const std::vector<LayerCost>& layers, int stages, const MemoryModel& m, double slack) {
  const int n = static_cast<int>(layers.size());
  return static_cast<int64_t>(slack * stage_memory(layers, 0, n, 0, m) / stages);
}

// A case whose later call finds another bottleneck than its first call is an error: a timing of
// a nondeterministic partitioner is worthless, and the exit status says so.
void time_case(benchmark::State& state, const Case& c, int stages, Check& check, bool& mismatch) {
  for (auto _ : state) {
    const Plan plan = min_max(c.layers, stages, c.constraints);
    if (check.first_bottleneck < 0) check.first_bottleneck = plan.bottleneck_ms;
    if (plan.bottleneck_ms != check.first_bottleneck) {
      char message[160];
      std::snprintf(message, sizeof message, "found bottleneck %.17g ms, first call %.17g ms",
                    plan.bottleneck_ms, check.first_bottleneck);
      check.error = message;
      state.SkipWithError(check.error.c_str());
      mismatch = true;
      break;
    }
  }
  state.counters["bottleneck_ms"] = check.first_bottleneck;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = 10000, stages = 64;
  std::vector<Case> cases;
  cases.push_back({"no limit", random_layers(n, 1, false), {}});
  {
    Case c{"limit, recompute never", random_layers(n, 1, false), {}};
    c.constraints.memory.in_flight.assign(stages, 8);
    c.constraints.devices.assign(stages,
                                 Device{1.0, even_limit(c.layers, stages, c.constraints.memory, 1.02)});
    cases.push_back(c);
  }
  {
    Case c{"limit, recompute except_last", random_layers(n, 1, false), {}};
    c.constraints.memory.recompute = Recompute::ExceptLast;
    c.constraints.memory.in_flight.assign(stages, 8);
    c.constraints.devices.assign(stages,
                                 Device{1.0, even_limit(c.layers, stages, c.constraints.memory, 1.02)});
    cases.push_back(c);
  }
  {
    Case c{"limit, except_last, 1F1B", random_layers(n, 1, false), {}};
    c.constraints.memory.recompute = Recompute::ExceptLast;
    for (int j = 0; j < stages; ++j) c.constraints.memory.in_flight.push_back(stages - j);
    c.constraints.devices.assign(stages,
                                 Device{1.0, even_limit(c.layers, stages, c.constraints.memory, 1.3)});
    cases.push_back(c);
  }
  {
    Case c{"no limit, speeds 1-4", random_layers(n, 1, false), {}};
    for (int j = 0; j < stages; ++j) c.constraints.devices.push_back(Device{1.0 + j % 4, 0});
    cases.push_back(c);
  }
  cases.push_back({"no limit, one dominant layer", random_layers(n, 1, true), {}});
  {
    Case c{"limit, except_last, dominant", random_layers(n, 1, true), {}};
    c.constraints.memory.recompute = Recompute::ExceptLast;
    c.constraints.memory.in_flight.assign(stages, 8);
    c.constraints.devices.assign(stages,
                                 Device{1.0, even_limit(c.layers, stages, c.constraints.memory, 1.5)});
    cases.push_back(c);
  }

  std::vector<Check> checks(cases.size());
  bool mismatch = false;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    Check& check = checks[i];
    benchmark::RegisterBenchmark(c.name, [&c, &check, &mismatch](benchmark::State& state) {
      time_case(state, c, stages, check, mismatch);
    })->Unit(benchmark::kMillisecond);
  }
  benchmark::AddCustomContext(
      "min_max", std::to_string(n) + " random layers into " + std::to_string(stages) + " stages");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return mismatch ? 1 : 0;
}
