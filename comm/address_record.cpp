// The store record of a rank's transport address (comm/address_record.h).
#include "comm/address_record.h"

#include <cstdint>

#include "common/error.h"
#include "common/hash.h"

namespace pipetrain::comm {

namespace {

// Magic, the writer's rank, the address length, an FNV-1a checksum of the address; then the address.
constexpr char kRecordMagic[4] = {'P', 'T', 'R', '1'};
constexpr size_t kRecordHeader = 4 + 4 + 4 + 8;
constexpr uint32_t kMaxAddressBytes = 1 << 20;

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}
uint64_t get_le(const std::string& in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  return v;
}

}  // namespace

std::string encode_address_record(int rank, const std::string& address) {
  std::string r(kRecordMagic, 4);
  put_le(r, static_cast<uint32_t>(rank), 4);
  put_le(r, address.size(), 4);
  put_le(r, fnv1a(address), 8);
  return r + address;
}

std::string decode_address_record(const std::string& record, int rank) {
  if (record.size() < kRecordHeader) throw Error(detail::concat(record.size(), " bytes, shorter than a record"));
  if (record.compare(0, 4, kRecordMagic, 4) != 0) throw Error("no record magic");
  const uint64_t writer = get_le(record, 4, 4), length = get_le(record, 8, 4), sum = get_le(record, 12, 8);
  if (writer != static_cast<uint64_t>(rank)) throw Error(detail::concat("written for rank ", writer));
  if (length > kMaxAddressBytes) throw Error(detail::concat("an address of ", length, " bytes"));
  if (record.size() != kRecordHeader + length)
    throw Error(detail::concat(record.size() - kRecordHeader, " address bytes where the record says ", length));
  std::string address = record.substr(kRecordHeader);
  if (fnv1a(address) != sum) throw Error("the checksum does not match");
  return address;
}

}  // namespace pipetrain::comm
