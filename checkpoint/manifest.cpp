// Checkpoint manifests (pipeline/manifest.h).
#include "checkpoint/manifest.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/hash.h"
#include "common/json_reader.h"
#include "common/precision.h"
#include "common/strings.h"

namespace pipetrain::checkpoint {

using json = nlohmann::json;

namespace {

// The hash that covers a manifest: every field but manifest_hash itself.
std::string manifest_hash(json m) {
  m.erase("manifest_hash");
  return identity_hash(m);
}

}  // namespace

std::string identity_hash(const json& identity) { return hex64(fnv1a(identity.dump())); }

int64_t step_of(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > (int64_t(1) << 50)) return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

void seal_manifest(json& m) {
  m["format"] = kManifestFormat;
  m["version"] = kManifestVersion;
  m["manifest_hash"] = manifest_hash(m);
}

json check_manifest(const std::string& text, const std::string& file, const std::string& dir_name) {
  const std::string where = "checkpoint " + file;
  json m;
  try {
    m = parse_json(text, "");
  } catch (const ConfigError& e) {
    // parse_json says ":line:col: invalid JSON: why" or ": nested deeper than N levels".
    const std::string why = e.what();
    throw CheckpointError(where + ": not valid JSON (" + why.substr(why.find_first_not_of(':')) + ")");
  }
  auto need = [&](const char* key, json::value_t type) {
    const bool ok = m.is_object() && m.contains(key) &&
                    (m.at(key).type() == type ||
                     (type == json::value_t::number_integer && m.at(key).is_number_unsigned()));
    if (!ok) throw CheckpointError(where + ": \"" + key + "\" is missing or of the wrong type");
  };
  need("format", json::value_t::string);
  if (m.at("format") != kManifestFormat)
    throw CheckpointError(where + ": format is " + brief(m.at("format")) + ", not \"" + kManifestFormat + "\"");
  need("version", json::value_t::number_integer);
  const json& version = m.at("version");
  if (!version.is_number_integer() || version.get<int64_t>() < kOldestManifestVersion || version.get<int64_t>() > kManifestVersion)
    throw CheckpointError(where + ": version " + brief(version) + " is not one this build reads (" +
                          std::to_string(kOldestManifestVersion) + " to " + std::to_string(kManifestVersion) + ")");
  if (version.get<int64_t>() >= 2) {
    need("manifest_hash", json::value_t::string);
    if (manifest_hash(m) != m.at("manifest_hash"))
      throw CheckpointError(where + ": the manifest does not match its hash (it was altered)");
  }
  for (const char* k : {"step", "batches", "pipeline_step", "stages"}) need(k, json::value_t::number_integer);
  need("identity", json::value_t::object);
  need("identity_hash", json::value_t::string);
  need("shards", json::value_t::array);
  // Written since mixed precision: the precision the run trained in, and fp16's loss scale.
  if (m.contains("precision") &&
      (!m.at("precision").is_string() ||
       std::find(precision_names().begin(), precision_names().end(), m.at("precision").get<std::string>()) ==
           precision_names().end()))
    throw CheckpointError(where + ": precision " + brief(m.at("precision")) + " is not one of fp32, bf16, fp16");
  if (m.contains("loss_scale") && (!m.at("loss_scale").is_number() || !(m.at("loss_scale").get<double>() > 0) ||
                                   !std::isfinite(m.at("loss_scale").get<double>())))
    throw CheckpointError(where + ": loss_scale " + brief(m.at("loss_scale")) + " is not a finite number > 0");
  if (m.contains("loss_scale_good_steps") && !m.at("loss_scale_good_steps").is_number_unsigned())
    throw CheckpointError(where + ": loss_scale_good_steps " + brief(m.at("loss_scale_good_steps")) +
                          " is not a count");
  if (m.value("precision", "fp32") == "fp16" && (!m.contains("loss_scale") || !m.contains("loss_scale_good_steps")))
    throw CheckpointError(where + ": an fp16 checkpoint lacks its loss scale");
  if (identity_hash(m.at("identity")) != m.at("identity_hash"))
    throw CheckpointError(where + ": the identity does not match its hash (the manifest was altered)");
  for (const json& s : m.at("shards"))
    if (!s.is_object() || !s.contains("file") || !s.at("file").is_string() || !s.contains("bytes") ||
        !s.at("bytes").is_number_unsigned() || !s.contains("crc32") || !s.at("crc32").is_number_unsigned() ||
        s.at("file").get<std::string>().find('/') != std::string::npos)
      throw CheckpointError(where + ": a shard entry lacks file, bytes or crc32: " + brief(s));

  // What drives a resume must agree with itself and with the directory's name: the data position
  // is step x accumulate, every pass of the pipeline consumed one batch, and a step-N directory
  // holds step N.
  const auto number = [&](const char* k) { return m.at(k).is_number_unsigned() && m.at(k).get<uint64_t>() > INT64_MAX
                                                      ? int64_t(-1) : m.at(k).get<int64_t>(); };
  const int64_t step = number("step"), batches = number("batches"), passes = number("pipeline_step");
  const int64_t stages = number("stages");
  const json& identity = m.at("identity");
  const int64_t accumulate = identity.contains("accumulate") && identity.at("accumulate").is_number_integer()
                                 ? identity.at("accumulate").get<int64_t>() : -1;
  if (step < 1 || step > (int64_t(1) << 40))
    throw CheckpointError(where + ": step " + brief(m.at("step")) + " is not a step a run can have saved");
  if (accumulate < 1 || batches != step * accumulate || passes != batches)
    throw CheckpointError(detail::concat(where, ": step ", step, ", batches ", brief(m.at("batches")), " and pipeline_step ",
                                         brief(m.at("pipeline_step")), " disagree (batches and passes must be step x ",
                                         "train.accumulate = ", step, " x ", accumulate, ")"));
  if (stages < 1 || stages > 4096 || m.at("shards").empty() || static_cast<int64_t>(m.at("shards").size()) % stages != 0)
    throw CheckpointError(detail::concat(where, ": ", m.at("shards").size(), " shards cannot come from ",
                                         brief(m.at("stages")), " stages"));
  const int64_t named = step_of(dir_name);
  if (named >= 0 && named != step)
    throw CheckpointError(detail::concat(where, ": holds step ", step, " but its directory is ", printable(dir_name, 80)));
  return m;
}

}  // namespace pipetrain::checkpoint
