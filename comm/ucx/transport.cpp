// ucx: the Transport protocol of the UCX backend (transport.h describes the messages): send()
// and recv() of a header with inline or separate data, the UCP operations they post with the
// completion callbacks of those, and the factories. The class is declared in internal.h, which
// says which file holds which of its parts.
#include "comm/ucx/transport.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <atomic>

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <ucp/api/ucp.h>

#include "comm/ucx/buffers.h"
#include "comm/ucx/internal.h"
#include "comm/ucx/process_watch.h"
#include "comm/ucx/tags.h"
#include "comm/ucx/testing.h"
#include "common/config.h"
#include "common/error.h"

namespace pipetrain::comm {

namespace ucx {

void UcxTransport::check_peer(int peer) const {
  if (peer < 0 || peer >= world_)
    throw TransportError(
        peer, detail::concat("rank ", rank_, ": peer rank ", peer, " outside world of size ", world_));
}

template <typename Doing>
void UcxTransport::check_usable(int peer, const Doing& doing) const {
  if (aborted_)
    throw TransportError(peer,
                         detail::concat("rank ", rank_, ": cannot ", doing(), ": aborted: ", abort_reason_));
  if (!send_error_.empty()) throw TransportError(send_error_peer_, send_error_);
  if (closing_ || peers_.empty())
    throw TransportError(peer,
                         detail::concat("rank ", rank_, ": cannot ", doing(), ": transport not connected"));
}

namespace {
std::atomic<uint64_t> host_staged_bytes{0};
std::atomic<uint64_t> read_ahead_count{0};  // headers read ahead (read_ahead), for tests

}  // namespace

void UcxTransport::send(int dst, const MessageId& id, const at::Tensor& tensor) {
  check_peer(dst);
  const WireHeader h = make_header(tensor, id);
  const auto header = encode(h);
  const uint64_t tag = header_tag(rank_, id);
  // A data payload that travels as device memory: a separate (not inline) GPU payload, where
  // this endpoint's UCX handles CUDA memory (device_memory_).
  const bool device = device_memory_ && tensor.is_cuda() && h.nbytes > kInlineBytes;
  at::Tensor data;
  if (device) {
    // UCX is not stream-aware: the work the current stream issued (the producer, and the copy
    // contiguous() may make) must be finished before UCX reads the memory.
    data = tensor.contiguous();
    c10::impl::VirtualGuardImpl(data.device().type()).getStream(data.device()).synchronize();
  } else if (tensor.device().is_cpu()) {
    data = tensor.contiguous();
  } else {
    data = tensor.to(at::kCPU).contiguous();  // on the current stream, after its work
    host_staged_bytes += h.nbytes;
  }
  std::lock_guard<std::mutex> lock(mu_);
  check_usable(dst, [&] { return detail::concat("send ", id.describe(), " to rank ", dst); });
  size_t before = sends_in_flight_;
  if (h.nbytes <= kInlineBytes) {
    auto op = new_op(OpKind::Send, dst, id);
    op->bytes.reset(new uint8_t[kWireHeaderBytes + h.nbytes]);
    std::memcpy(op->bytes.get(), header.data(), kWireHeaderBytes);
    if (h.nbytes) std::memcpy(op->bytes.get() + kWireHeaderBytes, data.data_ptr(), h.nbytes);
    const uint8_t* buffer = op->bytes.get();
    post_send(std::move(op), dst, buffer, kWireHeaderBytes + h.nbytes, tag);
  } else {
    auto head = new_op(OpKind::Send, dst, id);
    head->bytes.reset(new uint8_t[kWireHeaderBytes]);
    std::memcpy(head->bytes.get(), header.data(), kWireHeaderBytes);
    const uint8_t* buffer = head->bytes.get();
    post_send(std::move(head), dst, buffer, kWireHeaderBytes, tag);
    auto body = new_op(OpKind::Send, dst, id);
    body->tensor = data;  // kept alive until the send completes
    post_send(std::move(body), dst, data.data_ptr(), h.nbytes, data_tag(tag),
              device ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST);
  }
  if (static_cast<size_t>(sends_in_flight_) > before) wake();  // whoever drives moves them on
}

// Where the data of a message of `kind` is received: device memory for an activation or gradient
// that travels apart from its header where UCX carries device memory, else host memory (a pooled
// buffer for a huge one).
at::Tensor UcxTransport::buffer_for(const WireHeader& h, Kind kind) {
  const bool device = device_memory_ && h.nbytes > kInlineBytes && (kind == Kind::Activation || kind == Kind::Grad);
  if (!device) return h.nbytes >= HugeBuffers::kHugeMin ? HugeBuffers::instance()->tensor(h) : empty_for(h);
  // A device buffer is allocated on receive_stream_, which runs no kernel. The caching allocator
  // hands a block freed on a stream straight to that stream's next allocation, trusting the
  // stream's order to keep the old user's queued kernels ahead of the new user's; UCX writes
  // outside every stream, so a block from a compute stream could be overwritten while kernels
  // queued there still read it. A block of receive_stream_ is reused only once the streams it was
  // recorded on (its consumer's: stages/device_cuda.cpp) are done with it.
  c10::StreamGuard on_receive_stream(*receive_stream_);
  return at::empty(h.dims, at::TensorOptions().dtype(scalar_type_of(h.dtype)).device(options_.device));
}

at::Tensor UcxTransport::recv(int src, const MessageId& id, Deadline deadline) {
  check_peer(src);
  const uint64_t tag = header_tag(src, id);
  std::unique_lock<std::mutex> lock(mu_);
  check_usable(src, [&] { return detail::concat("receive ", id.describe(), " from rank ", src); });
  // A header read ahead (read_ahead) is this message's: it came first among those with its tag.
  Ahead ahead = take_ahead(tag);
  const bool read_ahead_here = ahead.head != nullptr;
  std::unique_ptr<Op> head = std::move(ahead.head), body = std::move(ahead.body);
  at::Tensor out = ahead.out;
  if (!read_ahead_here) {
    head = new_op(OpKind::Recv, src, id);
    head->bytes.reset(new uint8_t[kHeaderBufferBytes]);
    post_recv(*head, head->bytes.get(), kHeaderBufferBytes, tag, kAllBits);
  }
  wait(lock, head, src, id, deadline, "");
  if (read_ahead_here) head->info.length = ahead.length;  // the probe's: UCX 1.13's callback may not say
  lock.unlock();
  // What is wrong with a message read ahead is said here, as for any other; its data, if posted
  // already, goes with the receive that gives up on it.
  auto refuse = [&](std::exception_ptr error) -> at::Tensor {
    if (body) {
      std::lock_guard<std::mutex> relock(mu_);
      give_up(std::move(body));
    }
    std::rethrow_exception(error);
  };
  bool inline_data = false;
  WireHeader h;
  try {
    h = checked_header(*head, src, id);
    inline_data = h.nbytes <= kInlineBytes;
  } catch (...) {
    return refuse(std::current_exception());
  }
  if (!out.defined()) out = buffer_for(h, id.kind);
  if (inline_data) {
    if (h.nbytes) std::memcpy(out.data_ptr(), head->bytes.get() + kWireHeaderBytes, h.nbytes);
    return out;
  }

  lock.lock();
  try {
    check_usable(src,
                 [&] { return detail::concat("receive the data of ", id.describe(), " from rank ", src); });
  } catch (...) {
    lock.unlock();
    return refuse(std::current_exception());
  }
  if (!body) {
    body = new_op(OpKind::Recv, src, id);
    body->tensor = out;
    post_recv(*body, out.data_ptr(), h.nbytes, data_tag(tag), kAllBits, out.is_cuda() ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST);
  }
  read_ahead(src);
  ++data_waits_;
  try {
    wait(lock, body, src, id, deadline, "the data of ");
  } catch (...) {
    --data_waits_;
    throw;
  }
  --data_waits_;
  if (body->status != UCS_OK || body->info.length != h.nbytes)
    throw TransportError(
        src, detail::concat("rank ", rank_, ": receiving the data of ", id.describe(), " from rank ", src,
                            " failed: ", body->status != UCS_OK ? ucs_status_string(body->status) : "",
                            body->status == UCS_OK
                                ? detail::concat(body->info.length, " bytes, header announced ", h.nbytes)
                                : ""));
  return out;
}

// Up to options_.read_ahead messages of `src` whose header arrived before anyone asked for them (UCX's
// unexpected queue holds it) are received now, and where the data travels apart, its receive is
// posted into a buffer of its own: the rendezvous of the next message (UCX's handshake, and the
// copy it starts) goes on while this one's data arrives and while the caller works on it, which
// overlaps what costs each message a fixed time (bench/results/gpu/h200/transfers.jsonl). The
// headers are taken in their order of arrival per tag, and recv() looks here first, under the
// same lock: no message is matched out of the order UCX itself would keep. A header that does
// not decode is left for its recv() to refuse, with the error it would give anyway.
void UcxTransport::read_ahead(int src) {
  int& held = read_ahead_held_[src];
  while (held < options_.read_ahead) {
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h message = ucp_tag_probe_nb(worker_, rank_bits(src), kTypeMask | kRankMask, 1, &info);
    if (!message) return;
    const auto kind = static_cast<Kind>((info.sender_tag >> kKindShift) & 3);
    const MessageId id{kind, static_cast<int32_t>(info.sender_tag & 0xffffffffu),
                       static_cast<int>((info.sender_tag >> kChunkShift) & ((1u << kChunkBits) - 1))};
    Ahead a;
    a.length = info.length;
    a.head = new_op(OpKind::Recv, src, id);
    a.head->bytes.reset(new uint8_t[kHeaderBufferBytes]);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = &UcxTransport::on_recv;
    p.user_data = a.head.get();
    ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(worker_, a.head->bytes.get(), kHeaderBufferBytes, message, &p);
    if (UCS_PTR_IS_ERR(r)) {
      a.head->done = true;
      a.head->status = UCS_PTR_STATUS(r);
    } else if (!a.head->done) {
      a.head->request = r;
    }
    if (a.head->done && a.head->status == UCS_OK && info.length == kWireHeaderBytes) {
      try {
        const WireHeader h = decode(a.head->bytes.get(), kWireHeaderBytes, options_.max_message_bytes, src);
        if (h.nbytes > kInlineBytes) {
          a.out = buffer_for(h, kind);
          a.body = new_op(OpKind::Recv, src, id);
          a.body->tensor = a.out;
          post_recv(*a.body, a.out.data_ptr(), h.nbytes, data_tag(info.sender_tag), kAllBits,
                    a.out.is_cuda() ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST);
        }
      } catch (const std::exception&) {
        // its recv() decodes it again and refuses it (or, where the buffer could not be had, tries again)
      }
    }
    ++held;
    ++read_ahead_count;
    ahead_[info.sender_tag].push_back(std::move(a));
  }
}

// The oldest message read ahead with header tag `tag`, or an empty one.
UcxTransport::Ahead UcxTransport::take_ahead(uint64_t tag) {
  auto it = ahead_.find(tag);
  if (it == ahead_.end()) return {};
  Ahead a = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) ahead_.erase(it);
  --read_ahead_held_[a.head->peer];
  return a;
}

// The header of message `id` from `src`, received into `head`, decoded and checked: its status,
// its fields, and its length against the data it announces.
WireHeader UcxTransport::checked_header(const Op& head, int src, const MessageId& id) const {
  if (head.status == UCS_ERR_MESSAGE_TRUNCATED)
    throw TransportError(
        src, detail::concat("invalid message header from rank ", src, ": message for ", id.describe(),
                            " is larger than a header with inline data (", kHeaderBufferBytes, " bytes)"));
  if (head.status != UCS_OK)
    throw TransportError(src, detail::concat("rank ", rank_, ": receiving ", id.describe(), " from rank ",
                                             src, " failed: ", ucs_status_string(head.status)));
  const size_t length = head.info.length;
  const WireHeader h =
      decode(head.bytes.get(), std::min(length, kWireHeaderBytes), options_.max_message_bytes, src);
  check_received(h, id, rank_, src);
  const bool inline_data = h.nbytes <= kInlineBytes;
  const size_t expected = inline_data ? kWireHeaderBytes + h.nbytes : kWireHeaderBytes;
  if (length != expected)
    throw TransportError(src, detail::concat("invalid message from rank ", src, ": ", length,
                                             " bytes for a header announcing ", h.nbytes, " bytes of data (",
                                             expected, " expected)"));
  return h;
}

std::string UcxTransport::describe_endpoint(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  check_peer(peer);
  if (!peers_[peer]->ep) return "";
  char* text = nullptr;
  size_t size = 0;
  FILE* out = ::open_memstream(&text, &size);
  if (!out) return "";
  ucp_ep_print_info(peers_[peer]->ep, out);
  std::fclose(out);
  std::string s(text, size);
  std::free(text);
  return s;
}

void UcxTransport::send_raw_header(int dst, const MessageId& id, const std::string& bytes) {
  check_peer(dst);
  std::lock_guard<std::mutex> lock(mu_);
  check_usable(dst, [] { return std::string("send raw bytes"); });
  auto op = new_op(OpKind::Send, dst, id, "raw header");
  op->bytes.reset(new uint8_t[bytes.size() + 1]);
  std::memcpy(op->bytes.get(), bytes.data(), bytes.size());
  const uint8_t* buffer = op->bytes.get();
  post_send(std::move(op), dst, buffer, bytes.size(), header_tag(rank_, id));
  wake();
}

std::unique_ptr<UcxTransport::Op> UcxTransport::new_op(OpKind kind, int peer, const MessageId& id,
                                                       const char* label) {
  auto op = std::make_unique<Op>();
  op->owner = this;
  op->kind = kind;
  op->peer = peer;
  op->id = id;
  op->label = label;
  return op;
}

void UcxTransport::post_send(std::unique_ptr<Op> op, int dst, const void* buffer, size_t size, uint64_t tag,
                             ucs_memory_type_t memory) {
  Peer& peer = *peers_[dst];
  if (!peer.failure.empty())
    throw TransportError(dst, detail::concat("rank ", rank_, ": cannot send ", op->what(), " to rank ", dst,
                                             ": connection failed: ", peer.failure));
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  p.cb.send = &UcxTransport::on_send;
  p.user_data = op.get();
  p.memory_type = memory;
  ucs_status_ptr_t r = ucp_tag_send_nbx(peer.ep, buffer, size, tag, &p);
  if (r == nullptr) return;  // complete already; the buffer may go
  if (UCS_PTR_IS_ERR(r))
    throw TransportError(dst, detail::concat("rank ", rank_, ": cannot send ", op->what(), " to rank ", dst,
                                             ": ", ucs_status_string(UCS_PTR_STATUS(r))));
  op->request = r;
  ++sends_in_flight_;
  pending_.emplace(op.get(), std::move(op));
}

void UcxTransport::post_recv(Op& op, void* buffer, size_t size, uint64_t tag, uint64_t mask, ucs_memory_type_t memory) {
  // Without NO_IMM_CMPL a receive that matches at once returns NULL and UCX 1.13 leaves
  // recv_info (sender tag, length) unset; with it, the callback always runs, possibly right
  // here, before ucp_tag_recv_nbx returns.
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE |
                   UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.cb.recv = &UcxTransport::on_recv;
  p.user_data = &op;
  p.memory_type = memory;
  ucs_status_ptr_t r = ucp_tag_recv_nbx(worker_, buffer, size, tag, mask, &p);
  if (UCS_PTR_IS_ERR(r)) {
    op.done = true;
    op.status = UCS_PTR_STATUS(r);
  } else if (!op.done) {
    op.request = r;
  }
}

void UcxTransport::give_up(std::unique_ptr<Op> op) {
  if (!op->request) return;
  void* request = op->request;
  op->orphaned = true;
  Op* raw = op.get();
  pending_.emplace(raw, std::move(op));
  ucp_request_cancel(worker_, request);  // an unmatched receive completes (and is dropped) right here
}

void UcxTransport::on_send(void* request, ucs_status_t status, void* user) {
  auto* op = static_cast<Op*>(user);
  op->owner->send_done(op, request, status);
}

void UcxTransport::send_done(Op* op, void* request, ucs_status_t status) {
  ucp_request_free(request);
  if (op->kind == OpKind::Close) {
    --closes_in_flight_;
  } else {
    --sends_in_flight_;
    if (status != UCS_OK && status != UCS_ERR_CANCELED && send_error_.empty()) {
      send_error_peer_ = op->peer;
      send_error_ = detail::concat("rank ", rank_, ": sending ", op->what(), " to rank ", op->peer,
                                   " failed: ", ucs_status_string(status));
    }
  }
  pending_.erase(op);
  cv_.notify_all();
}

void UcxTransport::on_recv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* op = static_cast<Op*>(user);
  op->owner->recv_done(op, request, status, info);
}

void UcxTransport::recv_done(Op* op, void* request, ucs_status_t status, const ucp_tag_recv_info_t* info) {
  ucp_request_free(request);
  op->request = nullptr;
  if (op->orphaned) {
    pending_.erase(op);
    return;
  }
  op->status = status;
  if (info) op->info = *info;
  op->done = true;
  if (op->kind == OpKind::AbortNotice && status == UCS_OK && !aborted_) {
    const size_t n = std::min(op->info.length, kAbortReasonBytes);
    std::string reason(reinterpret_cast<const char*>(op->bytes.get()), n);
    mark_aborted(reason.empty() ? "a peer aborted" : reason);
  }
  cv_.notify_all();
}

void UcxTransport::on_ep_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  if (peer->failure.empty()) peer->failure = ucs_status_string(status);
  peer->owner->cv_.notify_all();
}

}  // namespace ucx

// The UCX loaded at run time, and the one built against where the two differ (an older UCX found
// first on the library path lacks what this build relies on: CUDA memory, for one).
std::string ucx_version() {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  std::string v = ucp_get_version_string();
  if (major != UCP_API_MAJOR || minor != UCP_API_MINOR)
    v += detail::concat(" (built against ", UCP_API_MAJOR, ".", UCP_API_MINOR, ")");
  return v;
}

std::unique_ptr<Transport> make_ucx_transport(int rank, int world_size, const AddressExchange& exchange,
                                              TransportOptions options) {
  ucx::AddressCheck check;  // starts while this rank makes its worker
  auto t = std::make_unique<ucx::UcxTransport>(rank, world_size, std::move(options));
  std::vector<std::string> addresses = exchange(t->address());
  if (addresses.size() != static_cast<size_t>(world_size))
    throw Error(detail::concat("ucx: the address exchange returned ", addresses.size(),
                               " addresses for a world of ", world_size));
  if (addresses[rank] != t->address())
    throw Error(detail::concat("ucx: the address exchange returned another address for rank ", rank));
  // The addresses came from other processes (through a store any client may write).
  std::vector<std::string> ucx_addresses;
  for (int r = 0; r < world_size; ++r) ucx_addresses.push_back(ucx::ucx_address_of(addresses[r], r));
  check.check(ucx_addresses, rank);
  t->connect(addresses);
  return t;
}

std::vector<std::unique_ptr<Transport>> make_ucx_group(int world_size, TransportOptions options) {
  std::vector<std::unique_ptr<ucx::UcxTransport>> ranks;
  std::vector<std::string> addresses;
  for (int r = 0; r < world_size; ++r) {
    ranks.push_back(std::make_unique<ucx::UcxTransport>(r, world_size, options));
    addresses.push_back(ranks.back()->address());
  }
  for (auto& t : ranks) t->connect(addresses);
  std::vector<std::unique_ptr<Transport>> group;
  for (auto& t : ranks) group.push_back(std::move(t));
  return group;
}

std::string ucx_endpoint_for_test(Transport& transport, int peer) {
  auto* t = dynamic_cast<ucx::UcxTransport*>(&transport);
  if (!t) throw Error("ucx_endpoint_for_test: not a UCX transport");
  return t->describe_endpoint(peer);
}

void send_raw_header_for_test(Transport& transport, int dst, const MessageId& id, const std::string& bytes) {
  auto* t = dynamic_cast<ucx::UcxTransport*>(&transport);
  if (!t) throw Error("send_raw_header_for_test: not a UCX transport");
  t->send_raw_header(dst, id, bytes);
}

uint64_t ucx_host_staged_bytes_for_test() { return ucx::host_staged_bytes.load(); }

uint64_t ucx_read_ahead_for_test() { return ucx::read_ahead_count.load(); }

}  // namespace pipetrain::comm
