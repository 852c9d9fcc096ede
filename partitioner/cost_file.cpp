// Cost files (partitioner/cost_file.h).
#include "partitioner/cost_file.h"

#include <algorithm>
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

namespace {

// "ties": [{"layers": [0, 33], "bytes": 411041792}, ...]: each tie's layers (two or more,
// distinct, within the file's layers) and the bytes of one member.
std::vector<TieCost> parse_ties(const nlohmann::json& list, size_t layers, const std::string& path) {
  if (!list.is_array() || list.size() > 65536)
    throw ConfigError(path + ": \"ties\" must be an array of objects with layers and bytes");
  std::vector<TieCost> out;
  for (size_t t = 0; t < list.size(); ++t) {
    const auto& e = list[t];
    const std::string where = detail::concat(path, ": ties[", t, "]");
    if (!e.is_object()) throw ConfigError(where + ": expected an object with layers and bytes");
    for (const auto& [key, value] : e.items())
      if (key != "layers" && key != "bytes")
        throw ConfigError(where + ": unknown key \"" + printable(key, 40) + "\" (expected layers, bytes)");
    if (!e.contains("layers") || !e["layers"].is_array() || e["layers"].size() < 2 || e["layers"].size() > layers)
      throw ConfigError(detail::concat(where, ": \"layers\" must list two or more of the file's ", layers, " layers"));
    TieCost tie;
    for (const auto& l : e["layers"]) {
      if (!l.is_number_integer() || l.get<double>() < 0 || l.get<double>() >= static_cast<double>(layers))
        throw ConfigError(detail::concat(where, ": \"layers\" holds ", describe(l), ", not a layer index from 0 to ", layers - 1));
      const int i = l.get<int>();
      if (std::find(tie.layers.begin(), tie.layers.end(), i) != tie.layers.end())
        throw ConfigError(detail::concat(where, ": \"layers\" names layer ", i, " twice"));
      tie.layers.push_back(i);
    }
    const auto& b = e.contains("bytes") ? e["bytes"] : nlohmann::json();
    if (!b.is_number_integer() || b.get<double>() < 0 || b.get<double>() > 1152921504606846976.0)
      throw ConfigError(detail::concat(where, ": \"bytes\" must be an integer from 0 to 2^60, got ", describe(b)));
    tie.bytes = b.get<int64_t>();
    out.push_back(std::move(tie));
  }
  return out;
}

}  // namespace

CostFile parse_cost_file(const std::string& text, const std::string& path) {
  const nlohmann::json top = parse_json(text, path);
  CostFile file;
  if (top.is_object()) {
    for (const auto& [key, value] : top.items())
      if (key != "layers" && key != "link" && key != "micro_batch" && key != "input_bytes" && key != "devices" && key != "ties")
        throw ConfigError(path + ": unknown key \"" + printable(key, 40) +
                          "\" (expected layers, link, micro_batch, input_bytes, devices, ties)");
    auto count = [&](const char* key, double max) -> int64_t {
      if (!top.contains(key)) return 0;
      const auto& v = top[key];
      if (!v.is_number_integer() || v.get<double>() < 1 || v.get<double>() > max)
        throw ConfigError(detail::concat(path, ": \"", key, "\" must be an integer from 1 to ", max, ", got ", describe(v)));
      return v.get<int64_t>();
    };
    file.micro_batch = count("micro_batch", 1 << 30);
    file.input_bytes = count("input_bytes", 1152921504606846976.0);
    if (top.contains("devices")) {
      const auto& list = top["devices"];
      if (!list.is_array() || list.empty() || list.size() > 65536)
        throw ConfigError(path + ": \"devices\" must be a non-empty array of objects with speed and bandwidth_gb_s");
      for (size_t d = 0; d < list.size(); ++d) {
        const auto& e = list[d];
        const std::string where = detail::concat(path, ": devices[", d, "]");
        if (!e.is_object()) throw ConfigError(where + ": expected an object with speed and bandwidth_gb_s");
        DeviceCost dev;
        for (const auto& [key, value] : e.items()) {
          if (key != "speed" && key != "bandwidth_gb_s")
            throw ConfigError(where + ": unknown key \"" + printable(key, 40) + "\" (expected speed, bandwidth_gb_s)");
          const double v = value.is_number() ? value.get<double>() : -1;
          if (!value.is_number() || !std::isfinite(v) || v <= 0 || v > 1e6)
            throw ConfigError(detail::concat(where, ": \"", key, "\" must be a number above 0 and up to 1e6, got ",
                                             describe(value)));
          (key == "speed" ? dev.speed : dev.bandwidth_gb_s) = v;
        }
        file.devices.push_back(dev);
      }
    }
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
    c.workspace_bytes = static_cast<int64_t>(number("workspace_bytes", false, kMaxBytes));
    if (e.contains("trainable_bytes")) {  // absent: every parameter trains
      c.trainable_bytes = static_cast<int64_t>(number("trainable_bytes", true, kMaxBytes));
      if (c.trainable_bytes > c.param_bytes)
        throw ConfigError(detail::concat(where, " (", shown_name, "): \"trainable_bytes\" (", c.trainable_bytes,
                                         ") exceeds \"param_bytes\" (", c.param_bytes, ")"));
    }
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
  if (top.is_object() && top.contains("ties")) file.ties = parse_ties(top["ties"], file.layers.size(), path);
  return file;
}

void write_cost_file(std::ostream& out, const CostFile& f) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& c : f.layers) {
    nlohmann::json e{{"name", c.name}, {"forward_ms", c.forward_ms}, {"backward_ms", c.backward_ms},
                     {"param_bytes", c.param_bytes}, {"activation_bytes", c.activation_bytes},
                     {"saved_bytes", c.saved_bytes}};
    if (c.backward_input_ms >= 0) e["backward_input_ms"] = c.backward_input_ms, e["backward_weight_ms"] = c.backward_weight_ms;
    if (c.workspace_bytes > 0) e["workspace_bytes"] = c.workspace_bytes;
    if (c.trainable_bytes >= 0 && c.trainable_bytes != c.param_bytes) e["trainable_bytes"] = c.trainable_bytes;
    layers.push_back(e);
  }
  nlohmann::json j{{"layers", layers}};
  if (f.bandwidth_gb_s > 0 || f.latency_ms > 0)
    j["link"] = {{"bandwidth_gb_s", f.bandwidth_gb_s}, {"latency_ms", f.latency_ms}};
  if (f.micro_batch > 0) j["micro_batch"] = f.micro_batch;
  if (f.input_bytes > 0) j["input_bytes"] = f.input_bytes;
  if (!f.devices.empty()) {
    j["devices"] = nlohmann::json::array();
    for (const auto& d : f.devices) {
      nlohmann::json e{{"speed", d.speed}};
      if (d.bandwidth_gb_s > 0) e["bandwidth_gb_s"] = d.bandwidth_gb_s;
      j["devices"].push_back(e);
    }
  }
  if (!f.ties.empty()) {
    j["ties"] = nlohmann::json::array();
    for (const auto& t : f.ties) j["ties"].push_back({{"layers", t.layers}, {"bytes", t.bytes}});
  }
  out << j.dump(1) << "\n";
}

CostFile scaled_to_rows(const CostFile& file, int64_t rows, const std::string& path) {
  if (file.micro_batch < 1)
    throw ConfigError(path + ": the file gives no \"micro_batch\" (the samples per micro-batch its costs are for), "
                      "which scaling them to other micro-batch sizes needs");
  const double r = static_cast<double>(rows) / static_cast<double>(file.micro_batch);
  auto bytes = [r](int64_t b) { return static_cast<int64_t>(std::llround(static_cast<double>(b) * r)); };
  CostFile out = file;
  out.micro_batch = rows;
  out.input_bytes = bytes(file.input_bytes);
  for (auto& c : out.layers) {
    c.forward_ms *= r, c.backward_ms *= r;
    if (c.backward_input_ms >= 0) c.backward_input_ms *= r, c.backward_weight_ms *= r;
    c.activation_bytes = bytes(c.activation_bytes);
    c.saved_bytes = bytes(c.saved_bytes);
    c.workspace_bytes = bytes(c.workspace_bytes);
  }
  return out;
}

}  // namespace pipetrain::partitioner
