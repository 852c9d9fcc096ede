// The header every message carries, and its validation. A receiver decodes and validates the
// header before it allocates anything, so a peer can never make it allocate more than
// `max_bytes` or read past a buffer. Little-endian, fixed size. No libtorch here.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain::comm {

constexpr uint32_t kWireMagic = 0x31575450;  // "PTW1" as little-endian bytes
constexpr uint16_t kWireVersion = 1;
constexpr int kWireMaxDims = 8;
constexpr size_t kWireHeaderBytes = 4 + 2 + 1 + 1 + 8 * kWireMaxDims + 8 + 8 + 8 + 8;

enum class WireDType : uint8_t {
  Float32 = 1, Float64 = 2, Float16 = 3, BFloat16 = 4,
  Int64 = 5, Int32 = 6, Int16 = 7, Int8 = 8, UInt8 = 9, Bool = 10,
};

// Bytes per element, or 0 for a code that is not a known dtype.
size_t dtype_size(uint8_t code);

struct WireHeader {
  WireDType dtype = WireDType::Float32;
  std::vector<int64_t> dims;
  uint64_t nbytes = 0;
  int64_t micro_batch = 0;
  int64_t step = 0;
  uint64_t tag = 0;
};

std::array<uint8_t, kWireHeaderBytes> encode(const WireHeader& h);

// Decodes `size` bytes from `peer` and validates them; throws TransportError naming the peer
// and the field that is wrong.
WireHeader decode(const uint8_t* data, size_t size, uint64_t max_bytes, int peer);

}  // namespace pipetrain::comm
