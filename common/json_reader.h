// Typed, path-aware reading of JSON config objects. Every error is one line that names where
// the value came from (the config file or the --set flag) and the full key path; unknown keys
// are refused with the nearest valid key.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace pipetrain {

// Where config values came from: full key path -> the override that set it ("--set a.b=1" on
// the command line); paths absent came from the file.
using Origins = std::map<std::string, std::string>;

// "<source>: <path>", or "<override>: <path>" for a path that an override set.
std::string where_of(const std::string& path, const std::string& source, const Origins* origins);

class JsonReader {
 public:
  // `origins` names the overrides that set values, so errors about them point at the override
  // instead of the file.
  JsonReader(const nlohmann::json& obj, std::string path, std::string source,
             std::shared_ptr<const Origins> origins = nullptr);

  bool has(const std::string& key) const;
  const std::string& path() const { return path_; }

  int64_t get_int(const std::string& key, int64_t def, int64_t min, int64_t max);
  int64_t require_int(const std::string& key, int64_t min, int64_t max);
  double get_number(const std::string& key, double def, double min, double max);
  bool get_bool(const std::string& key, bool def);
  std::string get_string(const std::string& key, const std::string& def);
  std::string get_choice(const std::string& key, const std::string& def,
                         const std::vector<std::string>& choices);
  std::vector<double> get_numbers(const std::string& key, const std::vector<double>& def);
  // The raw value, marked as known; for keys whose type depends on the value (e.g. balance).
  const nlohmann::json* get_raw(const std::string& key);

  // A nested object (empty if absent).
  JsonReader child(const std::string& key);
  // An array of objects, each read at "<path>.key[i]" (empty if absent); ConfigError naming the
  // key when it is not an array, or naming the element that is not an object.
  std::vector<JsonReader> objects(const std::string& key);

  // Throws ConfigError for the first key that was never read.
  void finish() const;

  // "where" prefix for a key: where_of() its full path.
  std::string where(const std::string& key) const;
  [[noreturn]] void fail(const std::string& key, const std::string& msg) const;

 private:
  std::string full(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const nlohmann::json* find(const std::string& key);

  nlohmann::json obj_;
  std::string path_;
  std::string source_;
  std::shared_ptr<const Origins> origins_;
  std::set<std::string> known_;
};

// While `into` is set (not null), every reader records the full path of each key it is asked
// for: the manual's check lists every config key this way (tests/docs_test.cpp). Not
// thread-safe; for tools, not for runs.
void record_keys(std::set<std::string>* into);
// Stops the recording for its lifetime: what a program generates and reads itself (a preset's
// layer list) holds no key of the user's.
class KeysUnrecorded {
 public:
  KeysUnrecorded();
  ~KeysUnrecorded();
  KeysUnrecorded(const KeysUnrecorded&) = delete;
  KeysUnrecorded& operator=(const KeysUnrecorded&) = delete;

 private:
  std::set<std::string>* saved_;
};

// Deeper nesting than this is refused: no config, manifest or cost file needs it.
constexpr int kMaxJsonDepth = 64;

// Parses JSON text; syntax errors become ConfigError "<source>:<line>:<col>: ...", nesting
// deeper than `max_depth` ConfigError "<source>: nested deeper than N levels".
nlohmann::json parse_json(const std::string& text, const std::string& source, int max_depth = kMaxJsonDepth);

// Describes a JSON value's type for error messages ("string \"4\"", "number 2.5").
std::string describe(const nlohmann::json& v);

// A JSON value in a one-line message: its compact text, printable, at most `max` characters.
std::string brief(const nlohmann::json& v, size_t max = 80);

}  // namespace pipetrain
