// The config reader and --set overrides. Input: the config's text, then NUL-separated --set
// texts. Every outcome is a parsed Config or a pipetrain::Error (a one-line ConfigError); any
// other exception, a crash or a sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/transport.h"
#include "common/error.h"
#include "common/json_reader.h"
#include "job/config.h"

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
  try {
    const auto c = pipetrain::job::parse_config(pipetrain::parse_json(parts[0], "fuzz.json"), "fuzz.json", overrides);
    (void)c.where("train.steps");
  } catch (const pipetrain::Error&) {
  }
  return 0;
}
