// Speed of the exact partitioner (partitioner/partition.h): min_max of 10,000 random layers
// into 64 stages, without and with memory limits, median of several runs. Every run must give
// the first run's bottleneck; exactness itself is tested in tests/partitioner_test.cpp against
// brute force and a dynamic program.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
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

// A limit that binds: `slack` times what each stage would hold if memory split evenly.
int64_t even_limit(const std::vector<LayerCost>& layers, int stages, const MemoryModel& m, double slack) {
  const int n = static_cast<int>(layers.size());
  return static_cast<int64_t>(slack * stage_memory(layers, 0, n, 0, m) / stages);
}

}  // namespace

int main() {
  const int n = 10000, stages = 64, runs = 15;
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

  std::printf("min_max: %d random layers into %d stages, median of %d runs\n", n, stages, runs);
  std::printf("%-32s %10s %10s %14s\n", "case", "median ms", "min ms", "bottleneck ms");
  for (const Case& c : cases) {
    std::vector<double> ms;
    double bottleneck = -1;
    for (int r = 0; r < runs; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const Plan plan = min_max(c.layers, stages, c.constraints);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      if (bottleneck >= 0 && plan.bottleneck_ms != bottleneck) {
        std::printf("%s: run %d found %.17g, first run %.17g\n", c.name, r, plan.bottleneck_ms, bottleneck);
        return 1;
      }
      bottleneck = plan.bottleneck_ms;
    }
    std::sort(ms.begin(), ms.end());
    std::printf("%-32s %10.3f %10.3f %14.4f\n", c.name, ms[ms.size() / 2], ms.front(), bottleneck);
  }
  return 0;
}
