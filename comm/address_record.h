// The record under which a rank publishes its transport address in the rendezvous store. Any
// client of the store can write any key, so the reader checks a record (magic, the writer's
// rank, the address length and an FNV-1a checksum) before the address reaches the transport:
// UCX aborts the process on a malformed worker address. No libtorch here.
#pragma once

#include <string>

namespace pipetrain::comm {

std::string encode_address_record(int rank, const std::string& address);

// The address in `record`, written for `rank`; throws Error saying what is wrong (short, bad
// magic, written for another rank, too long, bad checksum).
std::string decode_address_record(const std::string& record, int rank);

}  // namespace pipetrain::comm
