#include "comm/wire.h"

#include <cstring>

#include "common/error.h"

namespace pipetrain::comm {

size_t dtype_size(uint8_t code) {
  switch (static_cast<WireDType>(code)) {
    case WireDType::Float64: case WireDType::Int64: return 8;
    case WireDType::Float32: case WireDType::Int32: return 4;
    case WireDType::Float16: case WireDType::BFloat16: case WireDType::Int16: return 2;
    case WireDType::Int8: case WireDType::UInt8: case WireDType::Bool: return 1;
  }
  return 0;
}

namespace {
template <typename T>
void put(uint8_t*& p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) *p++ = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
}
template <typename T>
T get(const uint8_t*& p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(*p++) << (8 * i);
  return static_cast<T>(v);
}
}  // namespace

std::array<uint8_t, kWireHeaderBytes> encode(const WireHeader& h) {
  PIPETRAIN_CHECK(h.dims.size() <= static_cast<size_t>(kWireMaxDims), "too many dims: ", h.dims.size());
  std::array<uint8_t, kWireHeaderBytes> out{};
  uint8_t* p = out.data();
  put<uint32_t>(p, kWireMagic);
  put<uint16_t>(p, kWireVersion);
  put<uint8_t>(p, static_cast<uint8_t>(h.dtype));
  put<uint8_t>(p, static_cast<uint8_t>(h.dims.size()));
  for (int i = 0; i < kWireMaxDims; ++i)
    put<int64_t>(p, i < static_cast<int>(h.dims.size()) ? h.dims[i] : 0);
  put<uint64_t>(p, h.nbytes);
  put<int64_t>(p, h.micro_batch);
  put<int64_t>(p, h.step);
  put<uint64_t>(p, h.tag);
  return out;
}

WireHeader decode(const uint8_t* data, size_t size, uint64_t max_bytes, int peer) {
  auto bad = [&](const std::string& why) -> TransportError {
    return TransportError(peer, detail::concat("invalid message header from rank ", peer, ": ", why));
  };
  if (size != kWireHeaderBytes)
    throw bad(detail::concat("size ", size, " bytes, expected ", kWireHeaderBytes));
  const uint8_t* p = data;
  const uint32_t magic = get<uint32_t>(p);
  if (magic != kWireMagic) throw bad(detail::concat("bad magic 0x", std::hex, magic));
  const uint16_t version = get<uint16_t>(p);
  if (version != kWireVersion)
    throw bad(detail::concat("version ", version, ", this build speaks ", kWireVersion));
  const uint8_t dtype = get<uint8_t>(p);
  const size_t esize = dtype_size(dtype);
  if (esize == 0) throw bad(detail::concat("unknown dtype code ", int(dtype)));
  const uint8_t ndim = get<uint8_t>(p);
  if (ndim > kWireMaxDims) throw bad(detail::concat(int(ndim), " dims, at most ", kWireMaxDims));
  WireHeader h;
  h.dtype = static_cast<WireDType>(dtype);
  // The element count is checked against the limit as it grows, so it cannot overflow.
  const uint64_t max_elems = max_bytes / esize;
  uint64_t elems = 1;
  for (int i = 0; i < kWireMaxDims; ++i) {
    const int64_t d = get<int64_t>(p);
    if (i >= ndim) continue;
    if (d < 0) throw bad(detail::concat("negative dim ", i, ": ", d));
    if (d > 0 && elems > max_elems / static_cast<uint64_t>(d))
      throw bad(detail::concat("shape exceeds the message limit of ", max_bytes, " bytes"));
    elems *= static_cast<uint64_t>(d);
    h.dims.push_back(d);
  }
  h.nbytes = get<uint64_t>(p);
  if (h.nbytes > max_bytes)
    throw bad(detail::concat(h.nbytes, " bytes exceed the message limit of ", max_bytes));
  if (h.nbytes != elems * esize)
    throw bad(detail::concat(h.nbytes, " bytes do not match shape and dtype (", elems * esize, ")"));
  h.micro_batch = get<int64_t>(p);
  h.step = get<int64_t>(p);
  h.tag = get<uint64_t>(p);
  if (h.micro_batch < 0) throw bad(detail::concat("negative micro-batch ", h.micro_batch));
  return h;
}

}  // namespace pipetrain::comm
