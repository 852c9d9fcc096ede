// The model section of a config as a layer list (models/layer_list.cpp): what users write by hand.
// Input: the config's text, then NUL-separated --set texts, as config_fuzz. A config that parses
// and names model.family "layers" is built, with the parameter limit lowered from the machine's
// memory to 16M values, so that a large model is refused rather than made. Every outcome is a
// built model or a pipetrain::Error (a one-line ConfigError); any other exception, a crash or a
// sanitizer report is a bug. (The built-in families are fixed networks with a few sizes, and
// "torchscript" reads a file: neither is built here.)
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/transport.h"
#include "common/error.h"
#include "common/json_reader.h"
#include "job/config.h"
#include "models/families.h"

// The transports a build has, without linking the transports (the harness's one stand-in).
namespace pipetrain::comm {
bool has_transport_backend(const std::string& name) { return name == "local" || name == "ucx"; }
}  // namespace pipetrain::comm

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t nul; (nul = input.find('\0', start)) != std::string::npos; start = nul + 1)
    parts.push_back(input.substr(start, nul - start));
  parts.push_back(input.substr(start));
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  pipetrain::models::set_parameter_limit(1 << 24);
  try {
    const auto c = pipetrain::job::parse_config(pipetrain::parse_json(parts[0], "fuzz.json"), "fuzz.json", overrides);
    if (c.model.is_object() && c.model.contains("family") && c.model["family"] == "layers") {
      pipetrain::JsonReader model(c.model, "model", c.source, c.origins);
      (void)pipetrain::models::build(model, c.train.seed);
    }
  } catch (const pipetrain::Error&) {
  }
  return 0;
}
