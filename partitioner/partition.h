// partitioner: how the layers of a sequential model are split into contiguous stages.
// A balance is the number of layers per stage, in order. This folder offers the `uniform`
// method, checks of explicit lists, and the exact min-max partition of measured layer costs
// (`min_max`, `by_weights`) under per-device speeds and memory limits; nothing here depends on
// libtorch.
#pragma once

#include <string>
#include <vector>

#include "partitioner/cost.h"

namespace pipetrain::partitioner {

using Balance = std::vector<int>;

// Equal layer counts; when they do not divide evenly the later stages take one layer more
// (the last stages usually hold cheap layers such as the final norm and the head).
Balance uniform(int layers, int stages);

// Throws ConfigError (prefixed with `where`) unless `balance` has `stages` positive entries
// summing to `layers`.
void check(const Balance& balance, int layers, int stages, const std::string& where);

// First layer index of each stage, plus the total at the end (size stages + 1).
std::vector<int> offsets(const Balance& balance);

// "[4, 5]"; for messages, so a long list shows only its first and last entries.
std::string to_string(const Balance& balance);

// What the stages run on and what they hold.
struct Constraints {
  std::vector<Device> devices;  // one per stage, stage j on devices[j]; empty = speed 1, no limit
  MemoryModel memory;           // for stage_memory, checked against each device's memory_limit
};

// A partition and what the cost model predicts for it.
struct Plan {
  Balance balance;                   // layers per stage, every entry >= 1
  double bottleneck_ms = 0;          // the largest stage_ms: the optimum
  std::vector<double> stage_ms;      // stage_time of each stage on its device
  std::vector<int64_t> stage_bytes;  // stage_memory of each stage (also where there is no limit)
};

// The contiguous split of `costs` into `stages` non-empty stages that minimises the largest
// stage_time, subject to stage_memory <= memory_limit on every stage with a limit. Exact: the
// returned bottleneck_ms is the optimum, bit for bit, of stage_time over all such splits.
//
// Tie-break: among the splits with the optimal bottleneck, the one that minimises
// sum over stages of speed * stage_ms^2 (for equal speeds, the sum of squared stage times: the
// rest of the work is spread as evenly as the bottleneck allows); remaining ties go to the
// earliest boundaries, i.e. later stages take more layers. This is exact (up to the rounding of
// the sum) where every stage's memory cannot grow when its first layer moves later (recompute
// Never, ExceptLast with in_flight 1, or no limit on that stage); on other stages it is an exact
// scan, skipped when it would take more than 2^22 pair checks, in which case the split is still
// optimal for the bottleneck but the rest is not balanced.
//
// Throws ConfigError: stages < 1 or more stages than layers; devices or in_flight of the wrong
// size; non-finite or non-positive speeds, negative or non-finite costs or limits; a layer whose
// own bytes (parameters, state, saved tensors) exceed the limit of every stage it could go to
// (names the layer, its bytes and the limit); no split within the memory limits (names the stage,
// the bytes the split that exceeds the limits least still needs there, and the limit).
//
// Cost: a search over the bottleneck value (typically 10-30 steps), each step a feasibility
// probe; where memory is monotone in the stage start and every layer fits every stage alone, the
// probe is a greedy walk, O(stages * log(layers)); elsewhere it tracks every reachable boundary,
// O(stages * layers) time and memory. The tie-break is a dynamic program over the boundaries that
// optimal splits can use: O(stages * w log w) for w such boundaries per stage.
Plan min_max(const std::vector<LayerCost>& costs, int stages, const Constraints& constraints = {});

// Exact min-max split of a one-dimensional weight per layer (e.g. parameter bytes), with the
// same tie-break. Weights must be finite and >= 0.
Balance by_weights(const std::vector<double>& weights, int stages);

}  // namespace pipetrain::partitioner
