#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <sstream>

#include "common/error.h"
#include "partitioner/cost_file.h"
#include "partitioner/partition.h"

using namespace pipetrain;
using namespace pipetrain::partitioner;
using pipetrain::Recompute;

namespace {

Device device_of(const Constraints& c, int stage) { return c.devices.empty() ? Device{} : c.devices[stage]; }

// The optimum over all splits, from the public cost functions: the smallest bottleneck, and among
// the splits that reach it the smallest sum of speed * time^2 (the documented tie-break).
struct Reference {
  bool feasible = false;
  double bottleneck = 0;
  double spread = 0;
};

// Tries every split (at most C(13, 6) = 1716 for 14 layers).
Reference brute_force(const std::vector<LayerCost>& costs, int k, const Constraints& c) {
  const int n = static_cast<int>(costs.size());
  std::vector<double> time(k * (n + 1) * (n + 1));
  std::vector<char> fits(time.size());
  auto at = [&](int j, int b, int e) { return (j * (n + 1) + b) * (n + 1) + e; };
  for (int j = 0; j < k; ++j)
    for (int b = 0; b < n; ++b)
      for (int e = b + 1; e <= n; ++e) {
        const Device d = device_of(c, j);
        time[at(j, b, e)] = stage_time(costs, b, e, d);
        fits[at(j, b, e)] = d.memory_limit == 0 || stage_memory(costs, b, e, j, c.memory) <= d.memory_limit;
      }
  Reference r;
  std::function<void(int, int, double, double)> walk = [&](int j, int b, double worst, double spread) {
    if (j == k) {
      if (!r.feasible || worst < r.bottleneck || (worst == r.bottleneck && spread < r.spread))
        r = Reference{true, worst, spread};
      return;
    }
    const int last = j == k - 1 ? n : n - (k - 1 - j);
    for (int e = j == k - 1 ? n : b + 1; e <= last; ++e) {
      if (!fits[at(j, b, e)]) continue;
      const double t = time[at(j, b, e)];
      walk(j + 1, e, std::max(worst, t), spread + t * t * device_of(c, j).speed);
    }
  };
  walk(0, 0, 0, 0);
  return r;
}

// O(k n^2) dynamic programs for larger instances; in_flight must be equal for all stages (the
// memory table is shared). Stage times are stage_time on speed 1 divided by the speed, which is
// what stage_time computes.
Reference dynamic_program(const std::vector<LayerCost>& costs, int k, const Constraints& c) {
  const int n = static_cast<int>(costs.size());
  std::vector<double> num((n + 1) * (n + 1));
  std::vector<int64_t> mem(num.size());
  for (int b = 0; b < n; ++b)
    for (int e = b + 1; e <= n; ++e) {
      num[b * (n + 1) + e] = stage_time(costs, b, e, Device{});
      mem[b * (n + 1) + e] = stage_memory(costs, b, e, 0, c.memory);
    }
  auto allowed = [&](int j, int b, int e) {
    const Device d = device_of(c, j);
    return d.memory_limit == 0 || mem[b * (n + 1) + e] <= d.memory_limit;
  };
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> best(n + 1, inf), next(n + 1);
  best[0] = 0;
  for (int j = 0; j < k; ++j) {
    std::fill(next.begin(), next.end(), inf);
    for (int e = j + 1; e <= n; ++e)
      for (int b = j; b < e; ++b)
        if (best[b] < inf && allowed(j, b, e))
          next[e] = std::min(next[e], std::max(best[b], num[b * (n + 1) + e] / device_of(c, j).speed));
    best.swap(next);
    best[0] = inf;
  }
  Reference r;
  if (best[n] == inf) return r;
  r.feasible = true;
  r.bottleneck = best[n];
  std::vector<double> spread(n + 1, inf);
  spread[0] = 0;
  for (int j = 0; j < k; ++j) {
    std::fill(next.begin(), next.end(), inf);
    for (int e = j + 1; e <= n; ++e)
      for (int b = j; b < e; ++b) {
        const double t = num[b * (n + 1) + e] / device_of(c, j).speed;
        if (spread[b] < inf && allowed(j, b, e) && t <= r.bottleneck)
          next[e] = std::min(next[e], spread[b] + t * t * device_of(c, j).speed);
      }
    spread.swap(next);
    spread[0] = inf;
  }
  r.spread = spread[n];
  return r;
}

// Checks that `plan` is a valid split whose numbers are the public cost functions' numbers;
// returns its sum of speed * time^2.
double check_plan(const Plan& plan, const std::vector<LayerCost>& costs, int k, const Constraints& c) {
  const int n = static_cast<int>(costs.size());
  EXPECT_NO_THROW(check(plan.balance, n, k, "plan"));
  EXPECT_EQ(plan.stage_ms.size(), static_cast<size_t>(k));
  EXPECT_EQ(plan.stage_bytes.size(), static_cast<size_t>(k));
  const std::vector<int> off = offsets(plan.balance);
  double worst = 0, spread = 0;
  for (int j = 0; j < k && off.size() == static_cast<size_t>(k + 1); ++j) {
    const Device d = device_of(c, j);
    const double t = stage_time(costs, off[j], off[j + 1], d);
    const int64_t bytes = stage_memory(costs, off[j], off[j + 1], j, c.memory);
    EXPECT_EQ(plan.stage_ms[j], t) << "stage " << j;
    EXPECT_EQ(plan.stage_bytes[j], bytes) << "stage " << j;
    if (d.memory_limit) {
      EXPECT_LE(bytes, d.memory_limit) << "stage " << j;
    }
    worst = std::max(worst, t);
    spread += t * t * d.speed;
  }
  EXPECT_EQ(plan.bottleneck_ms, worst);
  return spread;
}

// Random instances that hit the hard cases: zeros, integer times (many ties), one dominant
// layer, mixed speeds, limits that bind or make the instance infeasible, every recompute mode.
struct Instance {
  std::vector<LayerCost> costs;
  int k = 1;
  Constraints c;
};

Instance random_instance(std::mt19937_64& rng, int max_n, bool equal_in_flight) {
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Instance in;
  const int n = pick(1, max_n);
  in.k = pick(1, n);
  const int time_kind = pick(0, 3);  // 0: small integers, 1: reals, 2: reals with zeros, 3: tiny/huge
  in.costs.resize(n);
  for (int i = 0; i < n; ++i) {
    LayerCost& l = in.costs[i];
    l.name = "L" + std::to_string(i);
    if (time_kind == 0)
      l.forward_ms = pick(0, 3), l.backward_ms = pick(0, 3);
    else if (time_kind == 3)
      l.forward_ms = std::pow(10.0, uniform(-6, 6)), l.backward_ms = uniform(0, 1);
    else
      l.forward_ms = uniform(0, 5), l.backward_ms = uniform(0, 10);
    if (time_kind == 2 && pick(0, 2) == 0) l.forward_ms = l.backward_ms = 0;
    l.param_bytes = pick(0, 1000);
    l.activation_bytes = pick(0, 600);
    l.saved_bytes = pick(0, 1) ? l.activation_bytes + pick(0, 600) : pick(0, 300);
  }
  // A third of the instances give layers a workspace (a stage needs its largest, not the sum).
  if (pick(0, 2) == 0)
    for (LayerCost& l : in.costs) l.workspace_bytes = pick(0, 3) ? pick(0, 800) : 0;
  if (pick(0, 4) == 0) in.costs[pick(0, n - 1)].forward_ms = 1000 * uniform(1, 3);
  if (pick(0, 6) == 0) in.costs[pick(0, n - 1)].param_bytes = 20000;
  MemoryModel& m = in.c.memory;
  m.recompute = static_cast<Recompute>(pick(0, 2));
  const double factors[] = {0, 1.5, 2, 3};
  m.state_factor = factors[pick(0, 3)];
  m.input_bytes = pick(0, 3) ? pick(0, 600) : 0;
  if (equal_in_flight)
    m.in_flight.assign(in.k, pick(1, 4));
  else if (pick(0, 2)) {
    for (int j = 0; j < in.k; ++j) m.in_flight.push_back(pick(1, 4));
  }
  const int speed_kind = pick(0, 2);  // 0: all 1, 1: small integers, 2: reals
  const int limit_kind = pick(0, 3);  // 0: none, 1: one for all, 2: per device, 3: some devices
  if (speed_kind == 0 && limit_kind == 0) return in;
  int64_t total = 0;
  for (const LayerCost& l : in.costs) total += l.param_bytes * 3 + l.saved_bytes * 2 + l.activation_bytes + l.workspace_bytes;
  const int64_t shared = static_cast<int64_t>(uniform(0.3, 2.5) * total / in.k) + 1;
  for (int j = 0; j < in.k; ++j) {
    Device d;
    if (speed_kind == 1) d.speed = pick(1, 4);
    if (speed_kind == 2) d.speed = uniform(0.1, 10);
    if (limit_kind == 1) d.memory_limit = shared;
    if (limit_kind == 2 || (limit_kind == 3 && pick(0, 1)))
      d.memory_limit = static_cast<int64_t>(uniform(0.3, 3) * total / in.k) + 1;
    in.c.devices.push_back(d);
  }
  return in;
}

void expect_matches(const Instance& in, const Reference& ref, const std::string& what) {
  SCOPED_TRACE(what);
  if (!ref.feasible) {
    EXPECT_THROW(min_max(in.costs, in.k, in.c), ConfigError);
    return;
  }
  Plan plan;
  try {
    plan = min_max(in.costs, in.k, in.c);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw " << e.what() << "; reference bottleneck " << ref.bottleneck;
    return;
  }
  EXPECT_EQ(plan.bottleneck_ms, ref.bottleneck);
  const double spread = check_plan(plan, in.costs, in.k, in.c);
  EXPECT_NEAR(spread, ref.spread, 1e-9 * ref.spread) << "balance " << to_string(plan.balance);
}

std::string describe(const Instance& in, int index) {
  std::string s = "instance " + std::to_string(index) + ": n=" + std::to_string(in.costs.size()) +
                  " k=" + std::to_string(in.k) +
                  " recompute=" + std::to_string(static_cast<int>(in.c.memory.recompute)) +
                  " devices=" + std::to_string(in.c.devices.size());
  return s;
}

std::vector<LayerCost> layers_of(const std::vector<double>& ms) {
  std::vector<LayerCost> costs(ms.size());
  for (size_t i = 0; i < ms.size(); ++i) costs[i].forward_ms = ms[i], costs[i].name = "L" + std::to_string(i);
  return costs;
}

std::vector<double> sorted_times(const Plan& p) {
  std::vector<double> t = p.stage_ms;
  std::sort(t.begin(), t.end());
  return t;
}

}  // namespace

TEST(Uniform, LaterStagesTakeTheRemainder) {
  EXPECT_EQ(uniform(10, 4), (Balance{2, 2, 3, 3}));
  EXPECT_EQ(offsets({2, 2, 3, 3}), (std::vector<int>{0, 2, 4, 7, 10}));
  EXPECT_THROW(uniform(3, 4), ConfigError);
  EXPECT_THROW(check({1, 0, 2}, 3, 3, "x"), ConfigError);
}

TEST(CostModel, StageMemoryFollowsTheRecomputeMode) {
  std::vector<LayerCost> costs(3);
  costs[0] = {"a", 1, 2, 100, 10, 30};
  costs[1] = {"b", 1, 2, 200, 20, 50};
  costs[2] = {"c", 1, 2, 400, 40, 70};
  MemoryModel m;
  m.state_factor = 1.5;
  m.in_flight = {4, 3};
  m.input_bytes = 7;
  // Stage 1 holds layers [1, 3): params 600, state 900, saved 120, input 10 (layer 0's output).
  m.recompute = Recompute::Never;
  EXPECT_EQ(stage_memory(costs, 1, 3, 1, m), 600 + 900 + 3 * 120);
  m.recompute = Recompute::Always;
  EXPECT_EQ(stage_memory(costs, 1, 3, 1, m), 600 + 900 + 3 * 10 + 120);
  m.recompute = Recompute::ExceptLast;
  EXPECT_EQ(stage_memory(costs, 1, 3, 1, m), 600 + 900 + 2 * 10 + 120);
  EXPECT_EQ(stage_memory(costs, 0, 1, 0, m), 100 + 150 + 3 * 7 + 30);  // the model input

  // 25.5 state bytes, rounded up.
  m.state_factor = 0.255;
  m.in_flight.clear();
  EXPECT_EQ(stage_memory(costs, 0, 1, 0, m), 100 + 26 + 0 * 7 + 30);
  EXPECT_EQ(stage_time(costs, 1, 3, Device{2.0, 0}), 3.0);
}

TEST(MinMax, MatchesBruteForceOnRandomInstances) {
  std::mt19937_64 rng(20240611);
  int feasible = 0;
  for (int i = 0; i < 40000; ++i) {
    const Instance in = random_instance(rng, 14, false);
    const Reference ref = brute_force(in.costs, in.k, in.c);
    feasible += ref.feasible;
    expect_matches(in, ref, describe(in, i));
    if (HasFailure()) break;
  }
  EXPECT_GT(feasible, 24000);  // the mix also has infeasible instances, but mostly feasible ones
  EXPECT_LT(feasible, 39000);
}

TEST(MinMax, MatchesDynamicProgramOnLargerInstances) {
  std::mt19937_64 rng(77);
  for (int i = 0; i < 1500; ++i) {
    const Instance in = random_instance(rng, 70, true);
    expect_matches(in, dynamic_program(in.costs, in.k, in.c), describe(in, i));
    if (HasFailure()) break;
  }
}

TEST(MinMax, OneStage) {
  const auto costs = layers_of({1, 2, 3});
  const Plan p = min_max(costs, 1);
  EXPECT_EQ(p.balance, (Balance{3}));
  EXPECT_EQ(p.bottleneck_ms, 6);
}

TEST(MinMax, OneLayerPerStage) {
  const auto costs = layers_of({5, 1, 4, 2});
  const Plan p = min_max(costs, 4);
  EXPECT_EQ(p.balance, (Balance{1, 1, 1, 1}));
  EXPECT_EQ(p.bottleneck_ms, 5);
  EXPECT_EQ(p.stage_ms, (std::vector<double>{5, 1, 4, 2}));
}

TEST(MinMax, ZeroCostLayers) {
  const Plan p = min_max(layers_of({0, 0, 0, 0, 0}), 3);
  EXPECT_EQ(p.bottleneck_ms, 0);
  EXPECT_NO_THROW(check(p.balance, 5, 3, "plan"));
  const Plan q = min_max(layers_of({0, 0, 2, 0, 0, 2, 0}), 2);
  EXPECT_EQ(q.bottleneck_ms, 2);
}

TEST(MinMax, DominantLayerGetsItsOwnStageAndTheRestIsEven) {
  std::vector<double> ms(31, 1.0);
  ms[10] = 100;  // 10 unit layers, the dominant one, 20 unit layers
  const Plan p = min_max(layers_of(ms), 5);
  EXPECT_EQ(p.bottleneck_ms, 100);
  // Left 1 stage and right 3 (10, 7, 7, 6) beats left 2 and right 2 (5, 5, 10, 10).
  EXPECT_EQ(sorted_times(p), (std::vector<double>{6, 7, 7, 10, 100}));
}

TEST(MinMax, TieBreakSpreadsTheRest) {
  // Every split of 10 equal layers into 4 stages has bottleneck 3; [3, 3, 3, 1] is one of them.
  const Plan p = min_max(layers_of(std::vector<double>(10, 1.0)), 4);
  EXPECT_EQ(p.bottleneck_ms, 3);
  EXPECT_EQ(sorted_times(p), (std::vector<double>{2, 2, 3, 3}));
}

TEST(MinMax, GreedyFillToTheAverageIsNotOptimal) {
  const std::vector<double> ms = {3, 3, 4};
  // The common heuristic: fill each stage while it stays within total / stages.
  const double target = 10.0 / 2;
  double first = 0;
  size_t i = 0;
  while (i < ms.size() && first + ms[i] <= target) first += ms[i++];
  const double greedy = std::max(first, 10.0 - first);
  EXPECT_EQ(greedy, 7);
  const Plan p = min_max(layers_of(ms), 2);
  EXPECT_EQ(p.bottleneck_ms, 6);
  EXPECT_EQ(p.balance, (Balance{2, 1}));
}

TEST(MinMax, HeavyLayerGoesToTheFastDevice) {
  // A probe that extends each stage as far as it can fails at t = 2: stage 0 takes [1, 1] and
  // leaves the heavy layer to the slow stage 1. The optimum 1 gives it to stage 2 (speed 100).
  Constraints c;
  c.devices = {{1, 0}, {1, 0}, {100, 0}};
  const Plan p = min_max(layers_of({1, 1, 50, 1}), 3, c);
  EXPECT_EQ(p.bottleneck_ms, 1);
  EXPECT_EQ(p.balance, (Balance{1, 1, 2}));
}

TEST(MinMax, StageInputDecidesWhereToCut) {
  // With recompute always a stage keeps its input for every micro-batch in flight: cutting after
  // layer 0 (a large output) does not fit, cutting after layer 1 does, at the same time.
  std::vector<LayerCost> costs = layers_of({1, 1, 1});
  costs[0].activation_bytes = 1000;
  costs[1].activation_bytes = 10;
  Constraints c;
  c.memory.recompute = Recompute::Always;
  c.memory.in_flight = {4, 4};
  c.devices = {{1, 500}, {1, 500}};
  const Plan p = min_max(costs, 2, c);
  EXPECT_EQ(p.balance, (Balance{2, 1}));
  EXPECT_EQ(p.bottleneck_ms, 2);
  EXPECT_EQ(p.stage_bytes[1], 4 * 10);
}

TEST(MinMax, MemoryLimitMovesTheBoundary) {
  std::vector<LayerCost> costs = layers_of({1, 1, 1, 1});
  for (auto& l : costs) l.param_bytes = 100;
  costs[0].param_bytes = 250;
  Constraints c;
  c.memory.state_factor = 0;
  c.devices = {{1, 300}, {1, 300}};
  const Plan p = min_max(costs, 2, c);  // [2, 2] would put 350 bytes on stage 0
  EXPECT_EQ(p.balance, (Balance{1, 3}));
  EXPECT_EQ(p.bottleneck_ms, 3);
  EXPECT_EQ(p.stage_bytes, (std::vector<int64_t>{250, 300}));
}

TEST(MinMax, HugeSetOfOptimalSplitsWithNonMonotoneMemory) {
  // 3000 unit layers before a dominant one, 4 stages, a limit on memory that depends on the stage
  // input: every split of the unit layers into 3 stages is optimal, more pairs than the exact
  // tie-break scans, so the split comes from the search itself. It must still be optimal.
  std::vector<double> ms(3001, 1.0);
  ms.back() = 10000;
  Constraints c;
  c.memory.recompute = Recompute::ExceptLast;
  c.memory.in_flight.assign(4, 2);
  c.devices.assign(4, Device{1.0, int64_t{1} << 40});
  const auto costs = layers_of(ms);
  const Plan p = min_max(costs, 4, c);
  EXPECT_EQ(p.bottleneck_ms, 10000);
  EXPECT_EQ(p.balance.back(), 1);
  check_plan(p, costs, 4, c);
}

TEST(MinMaxErrors, MoreStagesThanLayers) {
  try {
    min_max(layers_of({1, 2}), 3);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "partition: 3 stages but the model has only 2 layers");
  }
  EXPECT_THROW(min_max(layers_of({1}), 0), ConfigError);
}

TEST(MinMaxErrors, LayerTooLargeForEveryDeviceIsNamed) {
  std::vector<LayerCost> costs = layers_of({1, 1, 1});
  costs[1].name = "fc_huge";
  costs[1].param_bytes = 1000;
  Constraints c;
  c.memory.state_factor = 2;
  c.devices = {{1, 2000}, {1, 2000}};
  try {
    min_max(costs, 2, c);
    FAIL();
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fc_huge"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3000 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("2000 bytes"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(MinMaxErrors, NoSplitFitsNamesTheBestNeed) {
  std::vector<LayerCost> costs = layers_of({1, 1, 1, 1});
  for (auto& l : costs) l.param_bytes = 100;
  Constraints c;
  c.memory.state_factor = 0;
  c.devices = {{1, 150}, {1, 150}};  // each layer fits alone, but 4 layers need two per stage
  try {
    min_max(costs, 2, c);
    FAIL();
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("no split"), std::string::npos) << msg;
    EXPECT_NE(msg.find("needs 200 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("limit of 150 bytes"), std::string::npos) << msg;
  }
}

TEST(MinMaxErrors, BadInputsAreRefused) {
  auto expect_error = [](const std::vector<LayerCost>& costs, int k, const Constraints& c,
                         const std::string& part) {
    try {
      min_max(costs, k, c);
      ADD_FAILURE() << "no error for " << part;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  std::vector<LayerCost> costs = layers_of({1, 2, 3});
  costs[1].backward_ms = -1;
  expect_error(costs, 2, {}, "layer 1 'L1' has time -1");
  costs[1].backward_ms = std::nan("");
  expect_error(costs, 2, {}, "layer 1 'L1'");
  costs = layers_of({1, 2, 3});
  costs[2].saved_bytes = -5;
  expect_error(costs, 2, {}, "layer 2 'L2' has -5 bytes");
  costs = layers_of({1, 2, 3});
  Constraints c;
  c.devices = {{1, 0}, {0, 0}};
  expect_error(costs, 2, c, "device 1 has speed 0");
  c.devices = {{1, 0}, {std::nan(""), 0}};
  expect_error(costs, 2, c, "device 1 has speed nan");
  c.devices = {{1, -3}, {1, 0}};
  expect_error(costs, 2, c, "memory_limit -3");
  c.devices = {{1, 0}};
  expect_error(costs, 2, c, "1 devices given for 2 stages");
  c = {};
  c.memory.in_flight = {1, 2, 3};
  expect_error(costs, 2, c, "in_flight has 3 entries");
  c.memory.in_flight = {1, 0};
  expect_error(costs, 2, c, "in_flight[1] is 0");
  c = {};
  c.memory.state_factor = -1;
  expect_error(costs, 2, c, "state_factor");
}

TEST(ByWeights, IsExactMinMax) {
  EXPECT_EQ(by_weights({1, 2, 3, 4, 5, 6, 7, 8, 9}, 3), (Balance{5, 2, 2}));
  EXPECT_EQ(by_weights({4, 0, 0, 4}, 2), (Balance{1, 3}));
  EXPECT_THROW(by_weights({1, -1}, 1), ConfigError);
  EXPECT_THROW(by_weights({1, 2}, 3), ConfigError);
}

// A cost file's object form: the micro-batch its costs are for, the input bytes and the devices
// survive a write and a read; scaling to another micro-batch size scales times and activation
// bytes, not parameters; every bad field is a one-line error naming the file and the field.
TEST(CostFile, RoundTripScalingAndErrors) {
  CostFile f;
  f.layers = layers_of({1, 2});
  f.layers[0].param_bytes = 100, f.layers[0].activation_bytes = 40, f.layers[0].saved_bytes = 80;
  f.layers[0].backward_input_ms = 0.5, f.layers[0].backward_weight_ms = 1.5;
  f.layers[1].backward_input_ms = 1, f.layers[1].backward_weight_ms = 3;
  f.bandwidth_gb_s = 25, f.latency_ms = 0.02, f.micro_batch = 4, f.input_bytes = 64;
  f.devices = {{1.0, 0.0}, {0.5, 10.0}};
  f.ties = {{{0, 1}, 400}};
  std::ostringstream out;
  write_cost_file(out, f);
  const CostFile back = parse_cost_file(out.str(), "f.json");
  ASSERT_EQ(back.layers.size(), 2u);
  EXPECT_EQ(back.micro_batch, 4);
  EXPECT_EQ(back.input_bytes, 64);
  EXPECT_EQ(back.bandwidth_gb_s, 25);
  ASSERT_EQ(back.devices.size(), 2u);
  EXPECT_EQ(back.devices[1].speed, 0.5);
  EXPECT_EQ(back.devices[1].bandwidth_gb_s, 10);
  EXPECT_EQ(back.devices[0].bandwidth_gb_s, 0);  // the link's
  EXPECT_TRUE(back.split_given);
  ASSERT_EQ(back.ties.size(), 1u);
  EXPECT_EQ(back.ties[0].layers, (std::vector<int>{0, 1}));
  EXPECT_EQ(back.ties[0].bytes, 400);

  const CostFile half = scaled_to_rows(back, 2, "f.json");
  EXPECT_EQ(half.micro_batch, 2);
  EXPECT_EQ(half.input_bytes, 32);
  EXPECT_DOUBLE_EQ(half.layers[0].forward_ms, back.layers[0].forward_ms / 2);
  EXPECT_DOUBLE_EQ(half.layers[0].backward_weight_ms, 0.75);
  EXPECT_EQ(half.layers[0].activation_bytes, 20);
  EXPECT_EQ(half.layers[0].saved_bytes, 40);
  EXPECT_EQ(half.layers[0].param_bytes, 100);

  auto expect_error = [](const std::string& text, const std::string& part) {
    try {
      parse_cost_file(text, "c.json");
      ADD_FAILURE() << "no error for " << text;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  const std::string layer = R"([{"forward_ms": 1, "backward_ms": 1, "param_bytes": 1, "activation_bytes": 1}])";
  expect_error(R"({"layers": )" + layer + R"(, "micro_batch": 0})", "c.json: \"micro_batch\" must be an integer from 1");
  expect_error(R"({"layers": )" + layer + R"(, "micro_batch": 2.5})", "\"micro_batch\" must be an integer");
  expect_error(R"({"layers": )" + layer + R"(, "devices": []})", "\"devices\" must be a non-empty array");
  expect_error(R"({"layers": )" + layer + R"(, "devices": [{"speed": 0}]})", "c.json: devices[0]: \"speed\" must be a number above 0");
  expect_error(R"({"layers": )" + layer + R"(, "devices": [{"speed": 1}, {"fast": 1}]})", "devices[1]: unknown key \"fast\"");
  expect_error(R"({"layers": )" + layer + R"(, "stages": 2})", "unknown key \"stages\"");
  const std::string two = R"([{"forward_ms": 1, "backward_ms": 1, "param_bytes": 1, "activation_bytes": 1},
                              {"forward_ms": 1, "backward_ms": 1, "param_bytes": 1, "activation_bytes": 1}])";
  expect_error(R"({"layers": )" + two + R"(, "ties": {}})", "c.json: \"ties\" must be an array");
  expect_error(R"({"layers": )" + two + R"(, "ties": [{"layers": [0], "bytes": 1}]})", "ties[0]: \"layers\" must list two or more");
  expect_error(R"({"layers": )" + two + R"(, "ties": [{"layers": [0, 2], "bytes": 1}]})",
               "ties[0]: \"layers\" holds number 2, not a layer index from 0 to 1");
  expect_error(R"({"layers": )" + two + R"(, "ties": [{"layers": [1, 1], "bytes": 1}]})", "names layer 1 twice");
  expect_error(R"({"layers": )" + two + R"(, "ties": [{"layers": [0, 1], "bytes": -3}]})", "ties[0]: \"bytes\" must be an integer");
  expect_error(R"({"layers": )" + two + R"(, "ties": [{"layers": [0, 1]}]})", "\"bytes\" must be an integer from 0 to 2^60, got");
  expect_error(R"({"layers": )" + two + R"(, "ties": [{"layers": [0, 1], "bytes": 1, "dtype": 2}]})", "ties[0]: unknown key \"dtype\"");
  try {
    scaled_to_rows(parse_cost_file(layer, "c.json"), 2, "c.json");
    ADD_FAILURE() << "scaled without a micro_batch";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("c.json: the file gives no \"micro_batch\""), std::string::npos) << e.what();
  }
}
