// Rendezvous address records: anything read from the store. A record for rank 0..3 either
// decodes to an address that encodes back to the same record, or is refused with an Error.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "comm/address_record.h"
#include "common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string record(reinterpret_cast<const char*>(data), size);
  for (int rank = 0; rank < 4; ++rank) {
    try {
      const std::string address = pipetrain::comm::decode_address_record(record, rank);
      if (pipetrain::comm::encode_address_record(rank, address) != record) std::abort();
    } catch (const pipetrain::Error&) {
    }
  }
  return 0;
}
