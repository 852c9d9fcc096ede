#include "common/recompute.h"

#include "common/error.h"
#include "common/strings.h"

namespace pipetrain {

namespace {
thread_local bool recomputing_now = false;
}  // namespace

bool recomputing() { return recomputing_now; }
void set_recomputing(bool on) { recomputing_now = on; }

const std::vector<std::string>& recompute_modes() {
  static const std::vector<std::string> modes{"always", "except_last", "never"};
  return modes;
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::Always: return "always";
    case Recompute::ExceptLast: return "except_last";
    case Recompute::Never: return "never";
  }
  return "?";
}

Recompute parse_recompute(const std::string& name) {
  if (name == "always") return Recompute::Always;
  if (name == "except_last") return Recompute::ExceptLast;
  if (name == "never") return Recompute::Never;
  throw ConfigError("unknown recomputation mode \"" + name + "\" (use " + join(recompute_modes(), ", ") + ")");
}

}  // namespace pipetrain
