// The wire header decoder: any 104 bytes from a peer. A header it accepts describes exactly
// nbytes of data within the limit, and encodes back to a header that decodes the same.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "comm/wire.h"
#include "common/error.h"

using namespace pipetrain::comm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr uint64_t kLimit = uint64_t(1) << 32;
  try {
    const WireHeader h = decode(data, size, kLimit, 1);
    uint64_t elems = 1;
    for (int64_t d : h.dims) elems *= static_cast<uint64_t>(d);
    if (h.nbytes > kLimit || h.nbytes != elems * dtype_size(static_cast<uint8_t>(h.dtype))) std::abort();
    const auto again = encode(h);
    const WireHeader h2 = decode(again.data(), again.size(), kLimit, 1);
    if (h2.dims != h.dims || h2.nbytes != h.nbytes || h2.micro_batch != h.micro_batch || h2.step != h.step ||
        h2.tag != h.tag || h2.dtype != h.dtype)
      std::abort();
  } catch (const pipetrain::TransportError&) {
  }
  return 0;
}
