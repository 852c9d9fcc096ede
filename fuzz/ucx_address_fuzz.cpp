// UCX worker addresses as the rendezvous hands them to UCX: whatever bytes a client of the store
// could publish inside a well-formed address record (a forged record passes the record's own
// checks). Each input is checked the way a rank checks its peers' addresses, by comm/ucx's
// AddressCheck (UCX unpacks them in a process of its own, this program run again): the check
// accepts, or refuses naming the forged rank; this process, which would have unpacked them, is
// never harmed. An input is used twice: as an address of its own, and as edits (two bytes of
// place, one to xor) to a real worker address of this machine's UCX, so that mutations reach
// into UCX's packed format beyond its first bytes. UCX runs uninstrumented in the checking
// process, so coverage does not guide the mutations there: the target shows containment (no
// input harms the process that asked), not UCX's own robustness.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <ucp/api/ucp.h>

#include "comm/address_record.h"
#include "comm/ucx/internal.h"
#include "common/error.h"

namespace {

// A worker address of this machine's UCX, made once; its worker lives as long as the process, so
// that the untouched parts of an edited address lead to a worker that answers.
std::string real_address() {
  ucp_config_t* config = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) std::abort();
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  ucp_context_h context = nullptr;
  if (ucp_init(&params, config, &context) != UCS_OK) std::abort();
  ucp_config_release(config);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  if (ucp_worker_create(context, &wp, &worker) != UCS_OK) std::abort();
  ucp_address_t* address = nullptr;
  size_t length = 0;
  if (ucp_worker_get_address(worker, &address, &length) != UCS_OK) std::abort();
  std::string out(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(worker, address);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string real = real_address();
  std::string edited = real;
  for (size_t i = 0; i + 2 < size && !edited.empty(); i += 3)
    edited[(static_cast<size_t>(data[i]) << 8 | data[i + 1]) % edited.size()] ^= static_cast<char>(data[i + 2]);
  const std::string raw(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> published{real};
  for (const std::string& forged : {edited, raw}) {
    const int rank = static_cast<int>(published.size());
    std::string record;
    try {
      record = pipetrain::comm::encode_address_record(rank, forged);
    } catch (const pipetrain::Error&) {
      continue;  // not an address a record can carry (empty, oversized): refused before UCX
    }
    // As the rendezvous reads it: a well-formed record gives the forged bytes back.
    if (pipetrain::comm::decode_address_record(record, rank) != forged) std::abort();
    published.push_back(forged);
  }
  try {
    pipetrain::comm::ucx::AddressCheck check;
    check.check(published, 0);
  } catch (const pipetrain::TransportError& e) {
    // Refused naming a forged rank (or, when the check could not run at all, no rank).
    if (e.peer() == 0 || e.peer() >= static_cast<int>(published.size())) std::abort();
  }
  return 0;
}
