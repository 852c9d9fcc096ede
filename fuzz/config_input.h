// What the config fuzz targets (config_fuzz, layers_fuzz) share: their input, a config's text
// then NUL-separated --set texts, read into a Config. The transports a build has come from their
// table (comm/backend.cpp, linked without the transports). Included by one file of each program.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/json_reader.h"
#include "job/config.h"

namespace pipetrain::fuzz {

/// The config the input describes, with its overrides applied; throws what parse_config throws.
inline job::Config config_of(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t nul; (nul = input.find('\0', start)) != std::string::npos; start = nul + 1)
    parts.push_back(input.substr(start, nul - start));
  parts.push_back(input.substr(start));
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  return job::parse_config(parse_json(parts[0], "fuzz.json"), "fuzz.json", overrides);
}

}  // namespace pipetrain::fuzz
