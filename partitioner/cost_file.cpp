// Cost files (partitioner/cost_file.h).
#include "partitioner/cost_file.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/json_reader.h"
#include "common/strings.h"

namespace pipetrain::partitioner {

std::vector<LayerCost> load_costs(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open the cost file");
  std::stringstream text;
  text << in.rdbuf();
  return parse_costs(text.str(), path);
}

std::vector<LayerCost> parse_costs(const std::string& text, const std::string& path) {
  const nlohmann::json j = parse_json(text, path);
  if (!j.is_array() || j.empty())
    throw ConfigError(path + ": expected a non-empty JSON array with one object per layer");
  std::vector<LayerCost> costs;
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& e = j[i];
    const std::string where = detail::concat(path, ": entry ", i);
    if (!e.is_object()) throw ConfigError(where + ": expected an object");
    LayerCost c;
    c.name = e.contains("name") && e["name"].is_string() ? e["name"].get<std::string>()
                                                          : detail::concat("layer ", i);
    const std::string shown_name = printable(c.name, 60);
    // Times up to a day per layer, sizes up to 2^60 bytes: anything beyond is a broken file.
    auto number = [&](const char* key, bool required, double max) -> double {
      if (!e.contains(key)) {
        if (required) throw ConfigError(detail::concat(where, " (", shown_name, "): missing \"", key, "\""));
        return 0;
      }
      const double v = e[key].is_number() ? e[key].get<double>() : -1;
      if (!e[key].is_number() || !std::isfinite(v) || v < 0 || v > max)
        throw ConfigError(detail::concat(where, " (", shown_name, "): \"", key, "\" must be a number from 0 to ", max,
                                         ", got ", describe(e[key])));
      return v;
    };
    constexpr double kMaxMs = 86400e3, kMaxBytes = 1152921504606846976.0;  // 2^60
    c.forward_ms = number("forward_ms", true, kMaxMs);
    c.backward_ms = number("backward_ms", true, kMaxMs);
    c.param_bytes = static_cast<int64_t>(number("param_bytes", true, kMaxBytes));
    c.activation_bytes = static_cast<int64_t>(number("activation_bytes", true, kMaxBytes));
    c.saved_bytes = static_cast<int64_t>(number("saved_bytes", false, kMaxBytes));
    costs.push_back(c);
  }
  return costs;
}

}  // namespace pipetrain::partitioner
