// FNV-1a (64-bit): a fast, stable hash of bytes for identities and checksums that need no
// cryptographic strength (config fingerprints, run identities, address records).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace pipetrain {

inline uint64_t fnv1a(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// Sixteen lower-case hex digits.
inline std::string hex64(uint64_t v) {
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(v));
  return out;
}

}  // namespace pipetrain
