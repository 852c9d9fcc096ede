// The UCX backend. See ucx_transport.h for the message layout.
//
// Threads. A transport is used by its rank's stage thread (send, recv), by whichever thread
// calls abort(), and by its own progress thread. The worker is created in
// UCS_THREAD_MODE_SERIALIZED and every UCP call on it is made under `mu_`, which also guards
// all of this class's state; UCP completion and error callbacks run inside
// ucp_worker_progress (or ucp_request_cancel), i.e. with `mu_` already held. We use our own
// mutex rather than UCS_THREAD_MODE_MULTI because MULTI guards the worker with a spinlock that
// a thread would spin on while the holder is descheduled (two cores, several ranks per
// process), and our bookkeeping needs a lock anyway. Ranks of an in-process group have
// separate contexts and workers, so they never contend.
//
// Progress. A thread waiting in recv() drives the worker itself: it progresses, arms the
// worker and sleeps in poll() on the worker's event fd, so a message wakes the very thread
// that wants it. When nobody waits, the progress thread does the same, because sends return
// at once but rendezvous and fragmented sends only move when the sender's worker is
// progressed, and a stage that has sent its last message of a step does not call into the
// transport again until the next step. Exactly one thread drives at a time (`driver_`): with
// two threads arming and polling the worker, wake-ups were lost (each costing a 100 ms poll
// cap). A waiter that finds the progress thread driving
// wakes it through `wake_fd_` and takes over; other waiters sleep on `cv_` until their
// operation completes or the driver leaves.
#include "comm/ucx/ucx_transport.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include <ATen/ATen.h>
#include <ucp/api/ucp.h>

#include "common/error.h"

namespace pipetrain::comm {

namespace {

// UCP tag: bit 63 a data message (apart from its header), bits 63 and 62 an abort notice,
// bit 62 alone a liveness probe (ping or pong), bits 48-61 the sender's rank, bits 46-47 the kind, bits 32-45 the chunk, bits 0-31 the
// micro-batch. Whether data follows its header inside the same message is decided by the
// header's byte count alone (UCX 1.13 does not report the sender's tag reliably for a
// receive that matches at once, so nothing relies on it).
constexpr int kRankShift = 48;
constexpr int kRankBits = 14;
constexpr int kChunkBits = 14;
constexpr int kMaxWorld = 1 << kRankBits;
constexpr uint64_t kDataBit = uint64_t(1) << 63;
constexpr uint64_t kAbortTag = kDataBit | (uint64_t(1) << 62);
constexpr uint64_t kProbeTag = uint64_t(1) << 62;
constexpr uint64_t kTypeMask = kAbortTag;
constexpr uint64_t kRankMask = uint64_t(kMaxWorld - 1) << kRankShift;
constexpr uint64_t kAllBits = ~uint64_t(0);

// Data up to this size travels inside the header's message (one copy each way, one message);
// larger data is a message of its own, sent from and received into the tensor's memory.
constexpr size_t kInlineBytes = 8192;
constexpr size_t kHeaderBufferBytes = kWireHeaderBytes + kInlineBytes;
constexpr size_t kAbortReasonBytes = 1024;
constexpr size_t kProbeBytes = 8;  // sender rank and ping (0) or pong (1), two little-endian uint32
constexpr double kCloseSeconds = 5;           // bound on flushing and closing endpoints at destruction
constexpr double kAbortedCloseSeconds = 0.5;  // the same after an abort: peers stopped receiving
constexpr int kPollCapMs = 100;               // a sleeping driver looks at the worker at least this often
constexpr int kProgressBatch = 1024;
// A driver that finds nothing to do keeps progressing this long (yielding the core between
// rounds) before it sleeps: replies and the next fragment usually come within microseconds,
// and a poll() wake-up costs more. Measured on the 2-core box: 8-byte latency 30 -> 18 us, 64 KiB
// over shared memory 0.5 -> 2 GiB/s; spinning without yielding made both worse when the cores
// were busy.
constexpr auto kSpin = std::chrono::microseconds(50);
// While large data is on the move (a send in flight, or the data of a message being received)
// the events of a tcp stream come every few microseconds, and a driver that slept between them
// lost throughput (4 MiB over tcp, median of 5: 3.2 GiB/s with 50 us, 3.7 with 1 ms).
constexpr auto kStreamingSpin = std::chrono::microseconds(1000);

// Receive buffers of large messages. The data of a message lands where recv() allocates it,
// and the copy into it (cma, tcp) runs much faster into 2 MiB pages than into 4 KiB ones: a
// 4 MiB shared-memory transfer went from about 4.5 to about 7 GiB/s here (ucx_perftest
// allocates its buffers with huge pages too). So buffers of kHugeMin bytes and more are
// anonymous mappings advised for transparent huge pages, and freed ones are kept for reuse
// (up to kCacheBytes), which also spares the page faults of fresh memory.
class HugeBuffers {
 public:
  static constexpr size_t kPage = size_t(2) << 20;
  static constexpr size_t kHugeMin = kPage;
  static constexpr size_t kCacheBytes = size_t(256) << 20;

  static std::shared_ptr<HugeBuffers> instance() {
    static auto* cache = new std::shared_ptr<HugeBuffers>(new HugeBuffers);  // outlives every tensor
    return *cache;
  }

  // An uninitialised tensor of the header's dtype and shape (h.nbytes >= kHugeMin).
  at::Tensor tensor(const WireHeader& h) {
    const size_t bytes = (h.nbytes + kPage - 1) / kPage * kPage;
    void* p = take(bytes);
    if (!p) return empty_for(h);
    std::shared_ptr<HugeBuffers> self = instance();
    return at::from_blob(
        p, h.dims, [self, bytes](void* q) { self->give(q, bytes); },
        at::TensorOptions().dtype(scalar_type_of(h.dtype)));
  }

 private:
  void* take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end()) {
        void* p = it->second;
        free_.erase(it);
        cached_ -= bytes;
        return p;
      }
    }
    // Aligned to the huge page: map one page more and trim both ends.
    void* raw = ::mmap(nullptr, bytes + kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    const auto start = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (start + kPage - 1) / kPage * kPage;
    if (aligned > start) ::munmap(raw, aligned - start);
    if (const size_t tail = start + bytes + kPage - (aligned + bytes))
      ::munmap(reinterpret_cast<void*>(aligned + bytes), tail);
    ::madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);  // a hint; fine to fail
    return reinterpret_cast<void*>(aligned);
  }

  void give(void* p, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + bytes <= kCacheBytes) {
        free_.emplace(bytes, p);
        cached_ += bytes;
        return;
      }
    }
    ::munmap(p, bytes);
  }

  std::mutex mu_;
  std::multimap<size_t, void*> free_;  // by size
  size_t cached_ = 0;
};

// The one place where UCS status codes become exceptions.
void ucx_check(ucs_status_t status, const std::string& what) {
  if (status != UCS_OK) throw Error(detail::concat("ucx: ", what, ": ", ucs_status_string(status)));
}

uint64_t message_bits(const MessageId& id) {
  const auto kind = static_cast<uint64_t>(id.kind);
  if (kind > 3 || id.chunk < 0 || id.chunk >= (1 << kChunkBits))
    throw Error(
        detail::concat("ucx: cannot tag ", id.describe(), ": chunk must be in [0, ", 1 << kChunkBits, ")"));
  return (kind << 46) | (static_cast<uint64_t>(id.chunk) << 32) | static_cast<uint32_t>(id.micro_batch);
}

uint64_t header_tag(int src, const MessageId& id) {
  return (static_cast<uint64_t>(src) << kRankShift) | message_bits(id);
}

class UcxTransport final : public Transport {
 public:
  UcxTransport(int rank, int world, TransportOptions options);
  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  const std::string& address() const { return address_; }
  void connect(const std::vector<std::string>& addresses);

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "ucx"; }
  void send(int dst, const MessageId& id, const at::Tensor& tensor) override;
  at::Tensor recv(int src, const MessageId& id, Deadline deadline) override;
  void abort(const std::string& reason) override;

  void send_raw_header(int dst, const MessageId& id, const std::string& bytes);

 private:
  enum class OpKind { Send, Recv, AbortNotice, Probe, Close };
  // One UCP operation in flight. Sends and closes belong to `pending_` until their callback;
  // a receive belongs to the thread waiting on it, or to `pending_` once that thread gave up
  // (its buffer must outlive UCP's last write into it).
  struct Op {
    UcxTransport* owner = nullptr;
    OpKind kind = OpKind::Send;
    void* request = nullptr;
    bool done = false, orphaned = false;
    ucs_status_t status = UCS_INPROGRESS;
    ucp_tag_recv_info_t info{};
    int peer = -1;
    std::unique_ptr<uint8_t[]> bytes;   // header (and inline data), abort reason
    at::Tensor tensor;                  // data sent or received in place
    MessageId id{Kind::Activation, 0};  // the message, for errors
    const char* label = nullptr;        // or what else this is ("abort notice", ...)
    std::string what() const { return label ? label : id.describe(); }
  };
  struct Peer {
    UcxTransport* owner = nullptr;
    int rank = -1;
    ucp_ep_h ep = nullptr;
    std::string failure;  // set by the endpoint's error callback
    uint64_t pongs = 0;   // answers to this rank's liveness probes
  };

  static void on_send(void* request, ucs_status_t status, void* user);
  static void on_recv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  void send_done(Op* op, void* request, ucs_status_t status);
  void recv_done(Op* op, void* request, ucs_status_t status, const ucp_tag_recv_info_t* info);

  // All of these expect `mu_` to be held.
  void post_send(std::unique_ptr<Op> op, int dst, const void* buffer, size_t size, uint64_t tag);
  void post_recv(Op& op, void* buffer, size_t size, uint64_t tag, uint64_t mask);
  void wait(std::unique_lock<std::mutex>& lock, std::unique_ptr<Op>& op, int src, const MessageId& id,
            Deadline deadline, const char* part);
  void give_up(std::unique_ptr<Op> op);
  // Throws once aborted, after a failed send, or when not connected; `doing()` says what failed.
  template <typename Doing>
  void check_usable(int peer, const Doing& doing) const;
  void post_abort_notice_recv();
  // Liveness probes: a wait whose deadline passes pings its peer. A live peer (waiting or
  // computing: its progress is driven either way) answers; a stopped or hung one does not.
  void send_probe(int dst, uint32_t type);
  void service_probes();  // handles received probes, answers pings, reposts the receive

  void check_peer(int peer) const;
  std::unique_ptr<Op> new_op(OpKind kind, int peer, const MessageId& id, const char* label = nullptr);
  void mark_aborted(std::string reason);
  void wake();
  // One round of driving the worker with `lock` held on entry and exit: progress, then, if
  // nothing happened, arm the worker and sleep in poll() (lock released) until an event, a
  // wake-up, `until` or the poll cap. `abortable` also wakes on an abort.
  void drive(std::unique_lock<std::mutex>& lock, Clock::time_point until, bool abortable);
  void progress_loop();
  void release();

  const int rank_, world_;
  const TransportOptions options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int worker_fd_ = -1;
  int wake_fd_ = -1;   // "progress needed": drained by whoever drives next
  int abort_fd_ = -1;  // readable from the abort on, never drained
  bool peer_failure_mode_ = true;
  std::string address_;
  std::thread progress_;

  std::mutex mu_;
  std::condition_variable cv_;       // waiters that do not drive; destructor
  std::condition_variable idle_cv_;  // the progress thread, while a waiter drives
  enum class Driver { None, ProgressThread, Waiter } driver_ = Driver::None;
  int waiters_ = 0;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::map<Op*, std::unique_ptr<Op>> pending_;
  std::unique_ptr<Op> abort_notice_;  // the posted receive of a peer's abort notice
  std::unique_ptr<Op> probe_;         // the posted receive of a peer's ping or pong
  bool probes_off_ = false;           // the probe receive failed: no more reposts
  int sends_in_flight_ = 0, closes_in_flight_ = 0;
  int data_waits_ = 0;  // receives of large data in progress
  bool stopping_ = false, closing_ = false;
  bool aborted_ = false;
  std::string abort_reason_;
  int send_error_peer_ = -1;
  std::string send_error_;  // the first failed send, reported by the next call
};

UcxTransport::UcxTransport(int rank, int world, TransportOptions options)
    : rank_(rank),
      world_(world),
      options_(std::move(options)),
      peer_failure_mode_(options_.detect_peer_failure) {
  if (world < 1 || world > kMaxWorld)
    throw Error(detail::concat("ucx: world size ", world, " outside [1, ", kMaxWorld, "]"));
  if (rank < 0 || rank >= world)
    throw Error(detail::concat("ucx: rank ", rank, " outside world of size ", world));
  try {
    ucp_config_t* config = nullptr;
    ucx_check(ucp_config_read(nullptr, nullptr, &config), "reading the UCX configuration");
    if (!options_.net_devices.empty() && !std::getenv("UCX_NET_DEVICES")) {
      const ucs_status_t st = ucp_config_modify(config, "NET_DEVICES", options_.net_devices.c_str());
      if (st != UCS_OK) {
        ucp_config_release(config);
        ucx_check(st, "selecting the network devices " + options_.net_devices);
      }
    }
    ucp_params_t params{};
    params.field_mask =
        UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_TAG_SENDER_MASK | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    params.tag_sender_mask = kRankMask;
    params.estimated_num_eps = static_cast<size_t>(world);
    const ucs_status_t init = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    ucx_check(init, detail::concat("initialising a context for rank ", rank));

    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    ucx_check(ucp_worker_create(context_, &wp, &worker_),
              detail::concat("creating the worker of rank ", rank));
    ucx_check(ucp_worker_get_efd(worker_, &worker_fd_), "getting the worker's event fd");

    ucp_address_t* addr = nullptr;
    size_t len = 0;
    ucx_check(ucp_worker_get_address(worker_, &addr, &len), "getting the worker's address");
    address_.assign(reinterpret_cast<const char*>(addr), len);
    ucp_worker_release_address(worker_, addr);

    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    abort_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0 || abort_fd_ < 0) throw Error(detail::concat("ucx: eventfd: ", std::strerror(errno)));
    progress_ = std::thread([this] { progress_loop(); });
  } catch (...) {
    release();
    throw;
  }
}

void UcxTransport::connect(const std::vector<std::string>& addresses) {
  if (addresses.size() != static_cast<size_t>(world_))
    throw Error(
        detail::concat("ucx: rank ", rank_, " got ", addresses.size(), " addresses for a world of ", world_));
  std::lock_guard<std::mutex> lock(mu_);
  PIPETRAIN_CHECK(peers_.empty(), "connect() called twice");
  for (int r = 0; r < world_; ++r) {
    if (addresses[r].empty())
      throw Error(detail::concat("ucx: rank ", rank_, " got an empty address for rank ", r));
    auto peer = std::make_unique<Peer>();
    peer->owner = this;
    peer->rank = r;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(addresses[r].data());
    ep.err_mode = peer_failure_mode_ ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ep.err_handler.cb = &UcxTransport::on_ep_error;
    ep.err_handler.arg = peer.get();
    ucx_check(ucp_ep_create(worker_, &ep, &peer->ep),
              detail::concat("connecting rank ", rank_, " to rank ", r));
    peers_.push_back(std::move(peer));
  }
  post_abort_notice_recv();
  probe_ = new_op(OpKind::Probe, -1, MessageId{Kind::Activation, 0}, "liveness probe");
  probe_->bytes.reset(new uint8_t[kProbeBytes]);
  post_recv(*probe_, probe_->bytes.get(), kProbeBytes, kProbeTag, kTypeMask);
  wake();
}

UcxTransport::~UcxTransport() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    closing_ = true;
    // Sends still in flight are delivered first (bounded); after an abort nobody waits for them.
    if (!aborted_)
      cv_.wait_until(lock, Deadline::after(kCloseSeconds).at, [&] { return sends_in_flight_ == 0; });
    // A forced close needs peer-failure mode on both sides; without it endpoints are flushed.
    const bool force = peer_failure_mode_ && (aborted_ || sends_in_flight_ > 0);
    for (auto& peer : peers_) {
      if (!peer->ep) continue;
      auto op = new_op(OpKind::Close, peer->rank, MessageId{Kind::Activation, 0}, "endpoint close");
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
      p.cb.send = &UcxTransport::on_send;
      p.user_data = op.get();
      ucs_status_ptr_t r = ucp_ep_close_nbx(peer->ep, &p);
      peer->ep = nullptr;
      if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
        op->request = r;
        ++closes_in_flight_;
        pending_.emplace(op.get(), std::move(op));
      }
    }
    wake();
    cv_.wait_until(lock, Deadline::after(aborted_ ? kAbortedCloseSeconds : kCloseSeconds).at,
                   [&] { return closes_in_flight_ == 0; });
    stopping_ = true;
  }
  idle_cv_.notify_all();
  wake();
  if (progress_.joinable()) progress_.join();
  release();
}

// Frees what the constructor made; the progress thread has stopped (or never started).
void UcxTransport::release() {
  if (worker_) {
    std::lock_guard<std::mutex> lock(mu_);
    // Receives still posted are cancelled; their callbacks drop them from pending_.
    std::vector<void*> posted;
    for (std::unique_ptr<Op>* standing : {&abort_notice_, &probe_})
      if (*standing && (*standing)->request) {
        (*standing)->orphaned = true;
        posted.push_back((*standing)->request);
        Op* raw = standing->get();
        pending_.emplace(raw, std::move(*standing));
      }
    for (auto& [raw, op] : pending_)
      if (op->kind == OpKind::Recv && op->request) posted.push_back(op->request);
    for (void* request : posted) ucp_request_cancel(worker_, request);
    for (int i = 0; i < kProgressBatch && ucp_worker_progress(worker_) != 0; ++i) {
    }
    // Small messages nobody will receive any more (after a failed step) are taken out of UCX's
    // queue, so that destroying the worker does not warn about each of them. The first large
    // one (a rendezvous would need the peer) stops this.
    std::vector<uint8_t> scratch;
    for (int i = 0; i < 100000; ++i) {
      ucp_tag_recv_info_t info{};
      if (!ucp_tag_probe_nb(worker_, 0, 0, 0, &info) || info.length > kHeaderBufferBytes) break;
      ucp_tag_message_h message = ucp_tag_probe_nb(worker_, 0, 0, 1, &info);
      scratch.resize(std::max<size_t>(info.length, 1));
      ucp_request_param_t p{};
      ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(worker_, scratch.data(), info.length, message, &p);
      if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
        for (int j = 0; j < kProgressBatch && ucp_request_check_status(r) == UCS_INPROGRESS; ++j)
          ucp_worker_progress(worker_);
        const bool complete = ucp_request_check_status(r) != UCS_INPROGRESS;
        ucp_request_free(r);
        if (!complete) break;  // `scratch` stays as it is until the worker is gone
      }
    }
    for (auto& peer : peers_)
      if (peer->ep) {
        ucp_request_param_t p{};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_EP_CLOSE_FLAG_FORCE;
        ucs_status_ptr_t r = ucp_ep_close_nbx(peer->ep, &p);
        if (r != nullptr && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);
        peer->ep = nullptr;
      }
    ucp_worker_destroy(worker_);
    worker_ = nullptr;
  }
  pending_.clear();  // buffers go only now that UCP can no longer write into them
  if (context_) ucp_cleanup(context_);
  context_ = nullptr;
  for (int* fd : {&wake_fd_, &abort_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

void UcxTransport::wake() {
  const uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!::write(wake_fd_, &one, sizeof one);
}

void UcxTransport::drive(std::unique_lock<std::mutex>& lock, Clock::time_point until, bool abortable) {
  service_probes();
  const bool streaming = sends_in_flight_ > 0 || data_waits_ > 0;
  const auto spin_until = std::min(until, Clock::now() + (streaming ? kStreamingSpin : kSpin));
  for (;;) {  // until events, or the spin ends
    unsigned events = 0;
    for (int i = 0; i < kProgressBatch; ++i) {
      const unsigned n = ucp_worker_progress(worker_);
      if (n == 0) break;
      events += n;
    }
    if (events > 0) {
      service_probes();
      return;  // the caller looks at what changed before sleeping
    }
    if (aborted_ || stopping_ || Clock::now() >= spin_until) break;
    std::this_thread::yield();
  }
  if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) return;  // events arrived meanwhile
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
  const int timeout = static_cast<int>(std::clamp<int64_t>(left, 0, kPollCapMs));
  pollfd fds[3] = {{worker_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}, {abort_fd_, POLLIN, 0}};
  lock.unlock();
  ::poll(fds, abortable ? 3 : 2, timeout);
  if (fds[1].revents & POLLIN) {
    uint64_t count;
    (void)!::read(wake_fd_, &count, sizeof count);
  }
  lock.lock();
}

void UcxTransport::progress_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto idle = [&] { return driver_ == Driver::None && waiters_ == 0; };
  for (;;) {  // until the destructor sets stopping_
    idle_cv_.wait(lock, [&] { return stopping_ || idle(); });
    // A stage usually calls recv() again right after a recv (or a send): give it a moment to,
    // rather than taking the worker only to hand it back at once.
    idle_cv_.wait_for(lock, std::chrono::milliseconds(1), [&] { return stopping_ || !idle(); });
    if (stopping_) return;
    if (!idle()) continue;
    driver_ = Driver::ProgressThread;
    while (!stopping_ && waiters_ == 0)
      drive(lock, Clock::now() + std::chrono::milliseconds(kPollCapMs), false);
    driver_ = Driver::None;
    cv_.notify_all();
  }
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

void UcxTransport::mark_aborted(std::string reason) {
  aborted_ = true;
  abort_reason_ = std::move(reason);
  const uint64_t one = 1;
  (void)!::write(abort_fd_, &one, sizeof one);  // wakes a driver asleep in poll()
  cv_.notify_all();
}

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

void UcxTransport::post_send(std::unique_ptr<Op> op, int dst, const void* buffer, size_t size, uint64_t tag) {
  Peer& peer = *peers_[dst];
  if (!peer.failure.empty())
    throw TransportError(dst, detail::concat("rank ", rank_, ": cannot send ", op->what(), " to rank ", dst,
                                             ": connection failed: ", peer.failure));
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  p.cb.send = &UcxTransport::on_send;
  p.user_data = op.get();
  p.memory_type = UCS_MEMORY_TYPE_HOST;
  ucs_status_ptr_t r = ucp_tag_send_nbx(peer.ep, buffer, size, tag, &p);
  if (r == nullptr) return;  // complete already; the buffer may go
  if (UCS_PTR_IS_ERR(r))
    throw TransportError(dst, detail::concat("rank ", rank_, ": cannot send ", op->what(), " to rank ", dst,
                                             ": ", ucs_status_string(UCS_PTR_STATUS(r))));
  op->request = r;
  ++sends_in_flight_;
  pending_.emplace(op.get(), std::move(op));
}

void UcxTransport::post_recv(Op& op, void* buffer, size_t size, uint64_t tag, uint64_t mask) {
  // Without NO_IMM_CMPL a receive that matches at once returns NULL and UCX 1.13 leaves
  // recv_info (sender tag, length) unset; with it, the callback always runs, possibly right
  // here, before ucp_tag_recv_nbx returns.
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE |
                   UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.cb.recv = &UcxTransport::on_recv;
  p.user_data = &op;
  p.memory_type = UCS_MEMORY_TYPE_HOST;
  ucs_status_ptr_t r = ucp_tag_recv_nbx(worker_, buffer, size, tag, mask, &p);
  if (UCS_PTR_IS_ERR(r)) {
    op.done = true;
    op.status = UCS_PTR_STATUS(r);
  } else if (!op.done) {
    op.request = r;
  }
}

void UcxTransport::post_abort_notice_recv() {
  abort_notice_ = new_op(OpKind::AbortNotice, -1, MessageId{Kind::Activation, 0}, "abort notice");
  abort_notice_->bytes.reset(new uint8_t[kAbortReasonBytes]);
  post_recv(*abort_notice_, abort_notice_->bytes.get(), kAbortReasonBytes, kAbortTag, kTypeMask);
}

void UcxTransport::send_probe(int dst, uint32_t type) {
  auto op = new_op(OpKind::Send, dst, MessageId{Kind::Activation, 0}, type == 0 ? "liveness ping" : "liveness pong");
  op->bytes.reset(new uint8_t[kProbeBytes]);
  for (int i = 0; i < 4; ++i) {
    op->bytes[i] = static_cast<uint8_t>(static_cast<uint32_t>(rank_) >> (8 * i));
    op->bytes[4 + i] = static_cast<uint8_t>(type >> (8 * i));
  }
  const uint8_t* buffer = op->bytes.get();
  post_send(std::move(op), dst, buffer, kProbeBytes, kProbeTag | (static_cast<uint64_t>(rank_) << kRankShift));
}

void UcxTransport::service_probes() {
  std::vector<int> pings;
  for (int round = 0; probe_ && probe_->done && !probes_off_ && round < kProgressBatch; ++round) {
    if (probe_->status != UCS_OK) {  // cancelled at shutdown, or the receive failed
      probes_off_ = true;
      break;
    }
    if (probe_->info.length == kProbeBytes) {
      uint32_t sender = 0, type = 0;
      for (int i = 0; i < 4; ++i) {
        sender |= static_cast<uint32_t>(probe_->bytes[i]) << (8 * i);
        type |= static_cast<uint32_t>(probe_->bytes[4 + i]) << (8 * i);
      }
      if (sender < peers_.size()) {
        if (type == 0)
          pings.push_back(static_cast<int>(sender));
        else
          ++peers_[sender]->pongs;
      }
    }
    probe_->done = false;
    probe_->request = nullptr;
    probe_->status = UCS_INPROGRESS;
    post_recv(*probe_, probe_->bytes.get(), kProbeBytes, kProbeTag, kTypeMask);
  }
  if (aborted_ || closing_) return;
  for (int dst : pings) {
    try {
      send_probe(dst, 1);
    } catch (const TransportError&) {  // a peer that failed needs no answer
    }
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

void UcxTransport::wait(std::unique_lock<std::mutex>& lock, std::unique_ptr<Op>& op, int src,
                        const MessageId& id, Deadline deadline, const char* part) {
  ++waiters_;
  bool driving = false;
  // The last quarter of the wait (at most a second) probes the peer. No answer by the deadline:
  // it stopped answering, and the error says so. An answer: it is alive and itself waiting
  // (e.g. on a rank that stopped), so this wait goes on once more for as long, and the abort
  // notice of the rank that times out first, naming the rank at fault, ends it; or it times
  // out again.
  const Clock::duration length = deadline.at - Clock::now();
  const Clock::duration probe_window =
      std::clamp<Clock::duration>(length / 4, Clock::duration::zero(), std::chrono::seconds(1));
  const Clock::time_point probe_at = deadline.at - probe_window;
  enum class Phase { Waiting, Probing, Extended } phase = Phase::Waiting;
  uint64_t pongs_before = 0;
  auto leave = [&] {
    --waiters_;
    if (driving) driver_ = Driver::None;
    cv_.notify_all();       // another waiter may take over
    idle_cv_.notify_all();  // or the progress thread
  };
  for (;;) {  // ends by the deadline at the latest
    if (op->done) return leave();
    std::string error;
    bool timeout = false;
    if (aborted_) {
      error = detail::concat("rank ", rank_, ": aborted while waiting for ", part, id.describe(),
                             " from rank ", src, ": ", abort_reason_);
    } else if (!peers_[src]->failure.empty()) {
      error = detail::concat("rank ", rank_, ": connection to rank ", src, " failed while waiting for ", part,
                             id.describe(), ": ", peers_[src]->failure);
    } else if (phase == Phase::Probing && peers_[src]->pongs > pongs_before) {
      phase = Phase::Extended;
      deadline.at += length;
      continue;
    } else if (phase == Phase::Waiting && Clock::now() >= probe_at && src != rank_ &&
               probe_window > Clock::duration::zero()) {
      phase = Phase::Probing;
      pongs_before = peers_[src]->pongs;
      try {
        send_probe(src, 0);
      } catch (const TransportError&) {  // the next round reports the failed connection
      }
      wake();
      continue;
    } else if (deadline.passed()) {
      timeout = true;
      error = detail::concat("rank ", rank_, ": timed out waiting for ", part, id.describe(), " from rank ", src,
                             phase == Phase::Probing    ? ", which does not answer (stopped, hung or unreachable)"
                             : phase == Phase::Extended ? " (it is alive but did not send it)"
                                                        : "");
    }
    if (!error.empty()) {
      leave();
      give_up(std::move(op));
      if (timeout) throw TimeoutError(src, error);
      throw TransportError(src, error);
    }
    if (driver_ == Driver::None) {
      driver_ = Driver::Waiter;
      driving = true;
    }
    const Clock::time_point next = phase == Phase::Waiting ? std::min(deadline.at, probe_at) : deadline.at;
    if (driving) {
      drive(lock, next, true);
    } else {
      if (driver_ == Driver::ProgressThread) wake();  // asks it to hand over
      cv_.wait_until(lock, std::min(next, Clock::now() + std::chrono::milliseconds(kPollCapMs)));
    }
  }
}

void UcxTransport::send(int dst, const MessageId& id, const at::Tensor& tensor) {
  check_peer(dst);
  const WireHeader h = make_header(tensor, id);
  const auto header = encode(h);
  const uint64_t tag = header_tag(rank_, id);
  at::Tensor data = tensor.device().is_cpu() ? tensor.contiguous() : tensor.to(at::kCPU).contiguous();
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
    post_send(std::move(body), dst, data.data_ptr(), h.nbytes, tag | kDataBit);
  }
  if (static_cast<size_t>(sends_in_flight_) > before) wake();  // whoever drives moves them on
}

at::Tensor UcxTransport::recv(int src, const MessageId& id, Deadline deadline) {
  check_peer(src);
  const uint64_t tag = header_tag(src, id);
  std::unique_lock<std::mutex> lock(mu_);
  check_usable(src, [&] { return detail::concat("receive ", id.describe(), " from rank ", src); });
  auto head = new_op(OpKind::Recv, src, id);
  head->bytes.reset(new uint8_t[kHeaderBufferBytes]);
  post_recv(*head, head->bytes.get(), kHeaderBufferBytes, tag, kAllBits);
  wait(lock, head, src, id, deadline, "");
  lock.unlock();

  if (head->status == UCS_ERR_MESSAGE_TRUNCATED)
    throw TransportError(
        src, detail::concat("invalid message header from rank ", src, ": message for ", id.describe(),
                            " is larger than a header with inline data (", kHeaderBufferBytes, " bytes)"));
  if (head->status != UCS_OK)
    throw TransportError(src, detail::concat("rank ", rank_, ": receiving ", id.describe(), " from rank ",
                                             src, " failed: ", ucs_status_string(head->status)));
  const size_t length = head->info.length;
  const WireHeader h =
      decode(head->bytes.get(), std::min(length, kWireHeaderBytes), options_.max_message_bytes, src);
  check_received(h, id, rank_, src);
  const bool inline_data = h.nbytes <= kInlineBytes;
  const size_t expected = inline_data ? kWireHeaderBytes + h.nbytes : kWireHeaderBytes;
  if (length != expected)
    throw TransportError(src, detail::concat("invalid message from rank ", src, ": ", length,
                                             " bytes for a header announcing ", h.nbytes, " bytes of data (",
                                             expected, " expected)"));
  at::Tensor out = h.nbytes >= HugeBuffers::kHugeMin ? HugeBuffers::instance()->tensor(h) : empty_for(h);
  if (inline_data) {
    if (h.nbytes) std::memcpy(out.data_ptr(), head->bytes.get() + kWireHeaderBytes, h.nbytes);
    return out;
  }

  lock.lock();
  check_usable(src,
               [&] { return detail::concat("receive the data of ", id.describe(), " from rank ", src); });
  auto body = new_op(OpKind::Recv, src, id);
  body->tensor = out;
  post_recv(*body, out.data_ptr(), h.nbytes, tag | kDataBit, kAllBits);
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

void UcxTransport::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return;
  mark_aborted(reason);
  // Every peer hears of it, so that their waits end too (best effort: a failed notice is no
  // worse than a silent peer, which their deadlines cover).
  const size_t n = std::min(reason.size(), kAbortReasonBytes);
  for (auto& peer : peers_) {
    if (peer->rank == rank_ || !peer->ep || !peer->failure.empty() || closing_) continue;
    auto op = new_op(OpKind::Send, peer->rank, MessageId{Kind::Activation, 0}, "abort notice");
    op->bytes.reset(new uint8_t[n + 1]);
    std::memcpy(op->bytes.get(), reason.data(), n);
    const uint8_t* buffer = op->bytes.get();
    try {
      post_send(std::move(op), peer->rank, buffer, n,
                kAbortTag | (static_cast<uint64_t>(rank_) << kRankShift));
    } catch (const TransportError&) {
    }
  }
  wake();
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

}  // namespace

std::string ucx_version() { return ucp_get_version_string(); }

std::unique_ptr<Transport> make_ucx_transport(int rank, int world_size, const AddressExchange& exchange,
                                              TransportOptions options) {
  auto t = std::make_unique<UcxTransport>(rank, world_size, std::move(options));
  std::vector<std::string> addresses = exchange(t->address());
  if (addresses.size() != static_cast<size_t>(world_size))
    throw Error(detail::concat("ucx: the address exchange returned ", addresses.size(),
                               " addresses for a world of ", world_size));
  if (addresses[rank] != t->address())
    throw Error(detail::concat("ucx: the address exchange returned another address for rank ", rank));
  t->connect(addresses);
  return t;
}

std::vector<std::unique_ptr<Transport>> make_ucx_group(int world_size, TransportOptions options) {
  std::vector<std::unique_ptr<UcxTransport>> ranks;
  std::vector<std::string> addresses;
  for (int r = 0; r < world_size; ++r) {
    ranks.push_back(std::make_unique<UcxTransport>(r, world_size, options));
    addresses.push_back(ranks.back()->address());
  }
  for (auto& t : ranks) t->connect(addresses);
  std::vector<std::unique_ptr<Transport>> group;
  for (auto& t : ranks) group.push_back(std::move(t));
  return group;
}

void send_raw_header_for_test(Transport& transport, int dst, const MessageId& id, const std::string& bytes) {
  auto* ucx = dynamic_cast<UcxTransport*>(&transport);
  if (!ucx) throw Error("send_raw_header_for_test: not a UCX transport");
  ucx->send_raw_header(dst, id, bytes);
}

}  // namespace pipetrain::comm
