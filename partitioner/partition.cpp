#include "partitioner/partition.h"

#include <numeric>

#include "common/error.h"

namespace pipetrain::partitioner {

Balance uniform(int layers, int stages) {
  if (stages < 1) throw ConfigError(detail::concat("partition: stages must be >= 1, got ", stages));
  if (stages > layers)
    throw ConfigError(detail::concat("partition: ", stages, " stages but the model has only ",
                                     layers, " layers"));
  Balance b(stages, layers / stages);
  for (int i = 0; i < layers % stages; ++i) b[stages - 1 - i] += 1;
  return b;
}

void check(const Balance& balance, int layers, int stages, const std::string& where) {
  if (static_cast<int>(balance.size()) != stages)
    throw ConfigError(detail::concat(where, ": balance ", to_string(balance), " has ",
                                     balance.size(), " entries but pipeline.stages is ", stages));
  for (size_t i = 0; i < balance.size(); ++i)
    if (balance[i] < 1)
      throw ConfigError(detail::concat(where, ": balance ", to_string(balance), " gives stage ", i,
                                       " no layers (every entry must be >= 1)"));
  int sum = std::accumulate(balance.begin(), balance.end(), 0);
  if (sum != layers)
    throw ConfigError(detail::concat(where, ": balance ", to_string(balance), " sums to ", sum,
                                     " but the model has ", layers, " layers"));
}

std::vector<int> offsets(const Balance& balance) {
  std::vector<int> off(balance.size() + 1, 0);
  for (size_t i = 0; i < balance.size(); ++i) off[i + 1] = off[i] + balance[i];
  return off;
}

std::string to_string(const Balance& balance) {
  // Messages stay one readable line: a long list shows its first and last entries.
  constexpr size_t kHead = 12, kTail = 2;
  std::string s = "[";
  for (size_t i = 0; i < balance.size(); ++i) {
    if (balance.size() > kHead + kTail + 1 && i == kHead) {
      s += ", ... (" + std::to_string(balance.size()) + " entries)";
      i = balance.size() - kTail - 1;
      continue;
    }
    s += (i ? ", " : "") + std::to_string(balance[i]);
  }
  return s + "]";
}

}  // namespace pipetrain::partitioner
