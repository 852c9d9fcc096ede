#include "common/optimizer_kind.h"

#include "common/error.h"
#include "common/strings.h"

namespace pipetrain {

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names{"sgd", "adam", "adamw"};
  return names;
}

const char* optimizer_name(OptimizerKind kind) {
  return optimizer_names().at(static_cast<size_t>(kind)).c_str();
}

OptimizerKind parse_optimizer(const std::string& name, const std::string& where) {
  const auto& names = optimizer_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (name == names[i]) return static_cast<OptimizerKind>(i);
  throw ConfigError(where + ": unknown optimizer '" + name + "' (known: " + join(names, ", ") + ")");
}

}  // namespace pipetrain
