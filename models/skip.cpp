// Skip connections (models/skip.h).
#include "models/skip.h"

#include <algorithm>
#include <set>
#include <utility>

#include "common/error.h"
#include "common/strings.h"

namespace pipetrain::models {

std::vector<Skip> skips_of(const torch::nn::Sequential& layers) {
  std::vector<Skip> out;
  std::map<std::string, size_t> open;  // stashed, not yet popped: index in `out`
  int i = 0;
  for (const auto& item : layers->named_children()) {
    const auto* d = dynamic_cast<const SkipDeclaring*>(item.value().get());
    if (d) {
      for (const auto& name : d->pops()) {
        auto it = open.find(name);
        if (it == open.end())
          throw ConfigError(detail::concat("layer ", i, " (", item.key(), ") pops skip '", name, "', which no earlier layer stashes"));
        out[it->second].pop_layer = i;
        open.erase(it);
      }
      for (const auto& name : d->stashes()) {
        for (const Skip& s : out)
          if (s.name == name && s.pop_layer < 0)
            throw ConfigError(detail::concat("layer ", i, " (", item.key(), ") stashes skip '", name, "' again before it is popped"));
        open[name] = out.size();
        out.push_back({name, i, -1});
      }
    }
    ++i;
  }
  if (!open.empty())
    throw ConfigError(detail::concat("skip '", open.begin()->first, "' is stashed by layer ", out[open.begin()->second].stash_layer,
                                     " but no later layer pops it"));
  return out;
}

void check_skips(const std::vector<Skip>& skips, int layers, const std::string& where) {
  std::set<std::string> names;
  for (const Skip& s : skips) {
    if (!names.insert(s.name).second) throw ConfigError(where + ": skip '" + s.name + "' is listed twice");
    if (s.stash_layer < 0 || s.pop_layer <= s.stash_layer || s.pop_layer >= layers)
      throw ConfigError(detail::concat(where, ": skip '", s.name, "' goes from layer ", s.stash_layer, " to layer ",
                                       s.pop_layer, ", but needs 0 <= stash < pop < ", layers));
  }
}

std::vector<std::vector<std::string>> skips_crossing(const std::vector<Skip>& skips, const std::vector<int>& offsets) {
  std::vector<std::vector<std::string>> out(offsets.size() > 1 ? offsets.size() - 1 : 0);
  for (size_t b = 0; b + 1 < offsets.size(); ++b) {
    const int next = offsets[b + 1];  // the first layer after the cut
    for (const Skip& s : skips)
      if (s.stash_layer < next && s.pop_layer >= next) out[b].push_back(s.name);
    std::sort(out[b].begin(), out[b].end());
  }
  return out;
}

at::Tensor forward_with_skips(torch::nn::Sequential layers, const at::Tensor& input) {
  TensorSkipScope scope;
  at::Tensor out = layers->forward(input);
  const Skips left = scope.take();
  if (!left.empty()) throw Error("skip '" + left.begin()->first + "' is stashed but no later layer pops it");
  return out;
}

at::Tensor StashImpl::forward(const at::Tensor& x) {
  stash(name_, x);
  return x;
}

}  // namespace pipetrain::models
