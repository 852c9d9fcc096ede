// The skip contexts of each thread (common/skip.h), defined here once for the whole program.
#include "common/skip.h"

#include <typeindex>
#include <utility>
#include <vector>

namespace pipetrain::detail {

namespace {
// (value type, innermost open scope) of the calling thread; in practice one entry (at::Tensor).
// type_index compares the types' names, which every compiler spells alike.
std::vector<std::pair<std::type_index, void*>>& slots() {
  thread_local std::vector<std::pair<std::type_index, void*>> open;
  return open;
}
}  // namespace

void* skip_context(const std::type_info& value_type) {
  for (const auto& [type, scope] : slots())
    if (type == std::type_index(value_type)) return scope;
  return nullptr;
}

void set_skip_context(const std::type_info& value_type, void* scope) {
  for (auto& [type, open] : slots())
    if (type == std::type_index(value_type)) {
      open = scope;
      return;
    }
  slots().emplace_back(value_type, scope);
}

}  // namespace pipetrain::detail
