// partitioner: how the layers of a sequential model are split into contiguous stages.
// A balance is the number of layers per stage, in order. This slice offers the `uniform`
// method and explicit lists; nothing here depends on libtorch.
#pragma once

#include <string>
#include <vector>

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

std::string to_string(const Balance& balance);

}  // namespace pipetrain::partitioner
