#include "common/json_reader.h"

#include <cmath>

#include "common/error.h"
#include "common/strings.h"

namespace pipetrain {

using nlohmann::json;

JsonReader::JsonReader(const json& obj, std::string path, std::string source,
                       std::shared_ptr<const Origins> origins)
    : obj_(obj), path_(std::move(path)), source_(std::move(source)), origins_(std::move(origins)) {
  if (!obj_.is_null() && !obj_.is_object())
    throw ConfigError(detail::concat(source_, ": ", path_.empty() ? "config" : path_,
                                     ": expected an object, got ", describe(obj_)));
}

std::string where_of(const std::string& path, const std::string& source, const Origins* origins) {
  if (origins) {
    auto it = origins->find(path);
    if (it != origins->end()) return it->second + ": " + path;
  }
  return source + ": " + path;
}

std::string JsonReader::where(const std::string& key) const { return where_of(full(key), source_, origins_.get()); }

void JsonReader::fail(const std::string& key, const std::string& msg) const {
  throw ConfigError(where(key) + ": " + msg);
}

bool JsonReader::has(const std::string& key) const { return obj_.is_object() && obj_.contains(key); }

namespace {
std::set<std::string>*& key_recorder() {
  static std::set<std::string>* into = nullptr;
  return into;
}
}  // namespace

void record_keys(std::set<std::string>* into) { key_recorder() = into; }
KeysUnrecorded::KeysUnrecorded() : saved_(key_recorder()) { key_recorder() = nullptr; }
KeysUnrecorded::~KeysUnrecorded() { key_recorder() = saved_; }

const json* JsonReader::find(const std::string& key) {
  known_.insert(key);
  if (key_recorder()) key_recorder()->insert(full(key));
  if (!has(key)) return nullptr;
  const json& v = obj_.at(key);
  return v.is_null() ? nullptr : &v;
}

const json* JsonReader::get_raw(const std::string& key) { return find(key); }

std::string brief(const json& v, size_t max) {
  // Invalid UTF-8 (a bare --set word can hold any bytes) is replaced, not thrown on.
  return printable(v.dump(-1, ' ', false, json::error_handler_t::replace), max);
}

std::string describe(const json& v) {
  const auto text = [&] { return brief(v); };
  switch (v.type()) {
    case json::value_t::string: return "string " + text();
    case json::value_t::boolean: return "boolean " + text();
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return "number " + text();
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::null: return "null";
    default: return "a " + std::string(v.type_name());
  }
}

int64_t JsonReader::get_int(const std::string& key, int64_t def, int64_t min, int64_t max) {
  const json* v = find(key);
  if (!v) {
    return def;
  }
  int64_t x;
  if (v->is_number_integer() || v->is_number_unsigned()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail(key, detail::concat("must be between ", min, " and ", max, ", got ", v->get<uint64_t>(), " (value too large)"));
    x = v->get<int64_t>();
  } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
             std::fabs(v->get<double>()) < 9e15) {
    x = static_cast<int64_t>(v->get<double>());
  } else {
    fail(key, "expected an integer, got " + describe(*v));
  }
  if (x < min || x > max)
    fail(key, detail::concat("must be between ", min, " and ", max, ", got ", x));
  return x;
}

int64_t JsonReader::require_int(const std::string& key, int64_t min, int64_t max) {
  if (!find(key)) fail(key, "is required");
  return get_int(key, 0, min, max);
}

double JsonReader::get_number(const std::string& key, double def, double min, double max) {
  const json* v = find(key);
  if (!v) return def;
  if (!v->is_number()) fail(key, "expected a number, got " + describe(*v));
  double x = v->get<double>();
  if (!(x >= min && x <= max))
    fail(key, detail::concat("must be between ", min, " and ", max, ", got ", v->dump()));
  return x;
}

bool JsonReader::get_bool(const std::string& key, bool def) {
  const json* v = find(key);
  if (!v) return def;
  if (!v->is_boolean()) fail(key, "expected true or false, got " + describe(*v));
  return v->get<bool>();
}

std::string JsonReader::get_string(const std::string& key, const std::string& def) {
  const json* v = find(key);
  if (!v) return def;
  if (!v->is_string()) fail(key, "expected a string, got " + describe(*v));
  return v->get<std::string>();
}

std::string JsonReader::get_choice(const std::string& key, const std::string& def,
                                   const std::vector<std::string>& choices) {
  std::string s = get_string(key, def);
  for (const auto& c : choices)
    if (c == s) return s;
  std::string hint = nearest(s, choices);
  fail(key, "unknown value \"" + s + "\"" + (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)") +
                "; choose one of: " + join(choices, ", "));
}

std::vector<double> JsonReader::get_numbers(const std::string& key, const std::vector<double>& def) {
  const json* v = find(key);
  if (!v) return def;
  if (!v->is_array()) fail(key, "expected an array of numbers, got " + describe(*v));
  std::vector<double> out;
  for (const auto& e : *v) {
    if (!e.is_number()) fail(key, "expected an array of numbers, found " + describe(e));
    out.push_back(e.get<double>());
  }
  return out;
}

JsonReader JsonReader::child(const std::string& key) {
  const json* v = find(key);
  if (v && !v->is_object()) fail(key, "expected an object, got " + describe(*v));
  return JsonReader(v ? *v : json::object(), full(key), source_, origins_);
}

std::vector<JsonReader> JsonReader::objects(const std::string& key) {
  const json* v = find(key);
  std::vector<JsonReader> out;
  if (!v) return out;
  if (!v->is_array()) fail(key, "expected a list of objects, got " + describe(*v));
  for (size_t i = 0; i < v->size(); ++i) {
    const std::string element = key + "[" + std::to_string(i) + "]";
    if (!(*v)[i].is_object()) fail(element, "expected an object, got " + describe((*v)[i]));
    out.emplace_back((*v)[i], full(element), source_, origins_);
  }
  return out;
}

void JsonReader::finish() const {
  if (!obj_.is_object()) return;
  std::vector<std::string> valid(known_.begin(), known_.end());
  for (const auto& [k, v] : obj_.items()) {
    if (known_.count(k)) continue;
    std::string hint = nearest(k, valid);
    std::string msg = "unknown key";
    if (!hint.empty()) msg += " (did you mean '" + full(hint) + "'?)";
    else if (!valid.empty()) msg += "; valid keys here: " + join(valid, ", ");
    fail(k, msg);
  }
}

json parse_json(const std::string& text, const std::string& source, int max_depth) {
  // nlohmann's parser is iterative, but copying or comparing a value recurses once per level:
  // a document nested 100,000 deep would overflow the stack long after parsing.
  const json::parser_callback_t limit_depth = [&](int depth, json::parse_event_t, json&) {
    if (depth > max_depth)
      throw ConfigError(detail::concat(source, ": nested deeper than ", max_depth, " levels"));
    return true;
  };
  try {
    return json::parse(text, limit_depth);
  } catch (const json::parse_error& e) {
    // Turn the byte offset into line:column.
    size_t line = 1, col = 1;
    for (size_t i = 0; i + 1 < e.byte && i < text.size(); ++i) {
      if (text[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    std::string what = e.what();
    auto pos = what.find("syntax error");
    throw ConfigError(detail::concat(source, ":", line, ":", col, ": invalid JSON: ",
                                     printable(pos == std::string::npos ? what : what.substr(pos))));
  } catch (const json::out_of_range& e) {
    // A number beyond double's range ("1e400"): nlohmann says so with out_of_range 406.
    std::string what = e.what();
    const auto pos = what.find("] ");
    throw ConfigError(detail::concat(source, ": invalid JSON: ",
                                     printable(pos == std::string::npos ? what : what.substr(pos + 2))));
  }
}

}  // namespace pipetrain
