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

CostFile load_cost_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open the cost file");
  std::stringstream text;
  text << in.rdbuf();
  return parse_cost_file(text.str(), path);
}

std::vector<LayerCost> load_costs(const std::string& path) { return load_cost_file(path).layers; }

std::vector<LayerCost> parse_costs(const std::string& text, const std::string& path) {
  return parse_cost_file(text, path).layers;
}

CostFile parse_cost_file(const std::string& text, const std::string& path) {
  const nlohmann::json top = parse_json(text, path);
  CostFile file;
  if (top.is_object()) {
    for (const auto& [key, value] : top.items())
      if (key != "layers" && key != "link") throw ConfigError(path + ": unknown key \"" + printable(key, 40) + "\" (expected layers, link)");
    if (top.contains("link")) {
      const auto& link = top["link"];
      if (!link.is_object()) throw ConfigError(path + ": \"link\" must be an object with bandwidth_gb_s and latency_ms");
      auto field = [&](const char* key, double max) {
        if (!link.contains(key)) return 0.0;
        const double v = link[key].is_number() ? link[key].get<double>() : -1;
        if (!link[key].is_number() || !std::isfinite(v) || v < 0 || v > max)
          throw ConfigError(detail::concat(path, ": link: \"", key, "\" must be a number from 0 to ", max, ", got ",
                                           describe(link[key])));
        return v;
      };
      file.bandwidth_gb_s = field("bandwidth_gb_s", 1e6);
      file.latency_ms = field("latency_ms", 86400e3);
    }
  }
  const nlohmann::json& j = top.is_object() && top.contains("layers") ? top["layers"] : top;
  if (!j.is_array() || j.empty())
    throw ConfigError(path + ": expected a non-empty JSON array with one object per layer (or an object with \"layers\")");
  std::vector<LayerCost> costs;
  int split = 0;
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
    const bool has_b = e.contains("backward_input_ms"), has_w = e.contains("backward_weight_ms");
    if (has_b != has_w)
      throw ConfigError(detail::concat(where, " (", shown_name, "): backward_input_ms and backward_weight_ms go together"));
    if (has_b) {
      c.backward_input_ms = number("backward_input_ms", true, kMaxMs);
      c.backward_weight_ms = number("backward_weight_ms", true, kMaxMs);
      ++split;
    }
    costs.push_back(c);
  }
  file.split_given = split == static_cast<int>(costs.size());
  file.layers = std::move(costs);
  return file;
}

}  // namespace pipetrain::partitioner
