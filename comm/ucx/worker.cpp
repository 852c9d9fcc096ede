// ucx: the UCP context, worker and endpoints of a UcxTransport (internal.h), and who drives the
// worker's progress: wait(), drive(), the progress thread and the wake-up fds.
//
// Progress. A thread waiting in recv() drives the worker itself: it progresses, arms the
// worker and sleeps in poll() on the worker's event fd, so a message wakes the very thread
// that wants it. When nobody waits, the progress thread does the same, because sends return
// at once but rendezvous and fragmented sends only move when the sender's worker is
// progressed, and a stage that has sent its last message of a step does not call into the
// transport again until the next step. Exactly one thread drives at a time (`driver_`): with
// two threads arming and polling the worker, wake-ups were lost (each costing a 100 ms poll
// cap). A waiter that finds the progress thread driving wakes it through `wake_fd_` and takes
// over; other waiters sleep on `cv_` until their operation completes or the driver leaves.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include <c10/core/impl/VirtualGuardImpl.h>

#include "comm/ucx/internal.h"
#include "comm/ucx/process_watch.h"
#include "comm/ucx/tags.h"
#include "common/broken_pipe.h"
#include "common/config.h"
#include "common/error.h"
#include "common/log.h"

namespace pipetrain::comm::ucx {

namespace {

constexpr int kPollCapMs = 100;  // a sleeping driver looks at the worker at least this often
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

// The one place where UCS status codes become exceptions.
void ucx_check(ucs_status_t status, const std::string& what) {
  if (status != UCS_OK) throw Error(detail::concat("ucx: ", what, ": ", ucs_status_string(status)));
}

}  // namespace

UcxTransport::UcxTransport(int rank, int world, TransportOptions options)
    : rank_(rank),
      world_(world),
      options_(std::move(options)),
      peer_failure_mode_(options_.detect_peer_failure) {
  if (world < 1 || world > kMaxWorld)
    throw Error(detail::concat("ucx: world size ", world, " outside [1, ", kMaxWorld, "]"));
  if (rank < 0 || rank >= world)
    throw Error(detail::concat("ucx: rank ", rank, " outside world of size ", world));
  if (PIPETRAIN_UCX_CUDA && options_.device.is_cuda())
    receive_stream_ = c10::impl::VirtualGuardImpl(options_.device.type()).getStreamFromGlobalPool(options_.device, true);
  ignore_broken_pipe();  // a peer that went while UCX writes to its socket is an error, not a death
  route_ucx_log();  // from here on UCX's messages are our lines (log.cpp)
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
    if (PIPETRAIN_UCX_CUDA && options_.device.is_cuda()) {
      ucp_context_attr_t attr{};
      attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
      device_memory_ = ucp_context_query(context_, &attr) == UCS_OK &&
                       (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
      static std::once_flag said;
      if (!device_memory_)
        std::call_once(said, [] {
          log::warning(detail::concat("ucx: the UCX loaded at run time (", ucp_get_version_string(),
                                      ") does not handle CUDA memory: GPU tensors cross through the host"));
        });
    }

    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    ucx_check(ucp_worker_create(context_, &wp, &worker_),
              detail::concat("creating the worker of rank ", rank));
    ucx_check(ucp_worker_get_efd(worker_, &worker_fd_), "getting the worker's event fd");

    ucp_address_t* addr = nullptr;
    size_t len = 0;
    ucx_check(ucp_worker_get_address(worker_, &addr, &len), "getting the worker's address");
    address_ = identity_record();  // process_watch.h: who this rank is, then its worker's address
    address_.append(reinterpret_cast<const char*>(addr), len);
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
    const std::string ucx_address = ucx_address_of(addresses[r], r);
    auto peer = std::make_unique<Peer>();
    peer->owner = this;
    peer->rank = r;
    // A peer process on this host is watched through its pidfd instead of UCX's peer-failure
    // mode, which would keep its endpoint off shared memory (process_watch.h); a peer in this
    // process needs neither.
    if (peer_failure_mode_) {
      const PeerProcess process = watch_peer(addresses[r]);
      peer->pidfd = process.pidfd;
      peer->pid = process.pid;
      peer->ucx_detects = !process.this_process && process.pidfd < 0;
    }
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(ucx_address.data());
    ep.err_mode = peer->ucx_detects ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ep.err_handler.cb = &UcxTransport::on_ep_error;
    ep.err_handler.arg = peer.get();
    const ucs_status_t st = ucp_ep_create(worker_, &ep, &peer->ep);
    peers_.push_back(std::move(peer));  // owns the pidfd from here on (release())
    ucx_check(st, detail::concat("connecting rank ", rank_, " to rank ", r));
  }
  post_abort_notice_recv();
  post_probe_recv();
  wake();
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
    if (driver_ == Driver::ProgressThread && waiters_ > 0) return;  // a waiter takes over (progress_loop)
    // Between rounds the lock is free: a stage's send() (which only posts) must not wait for a
    // driver's spin, up to kStreamingSpin while its own earlier sends are in flight.
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
  if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) return;  // events arrived meanwhile
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
  const int timeout = static_cast<int>(std::clamp<int64_t>(left, 0, kPollCapMs));
  std::vector<pollfd> fds = {{worker_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}, {abortable ? abort_fd_ : -1, POLLIN, 0}};
  constexpr size_t kFirstPeer = 3;
  for (const auto& peer : peers_)  // a watched process that exits makes its pidfd readable
    fds.push_back({peer->pidfd >= 0 && peer->failure.empty() ? peer->pidfd : -1, POLLIN, 0});
  lock.unlock();
  ::poll(fds.data(), fds.size(), timeout);
  if (fds[1].revents & POLLIN) {
    uint64_t count;
    (void)!::read(wake_fd_, &count, sizeof count);
  }
  lock.lock();
  note_exits(fds, kFirstPeer);
}

void UcxTransport::note_exits(const std::vector<pollfd>& fds, size_t first) {
  for (size_t i = first; i < fds.size(); ++i) {
    Peer& peer = *peers_[i - first];
    if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)) || !peer.failure.empty()) continue;
    peer.failure = detail::concat("its process (pid ", peer.pid, ") exited");
    cv_.notify_all();
  }
}

void UcxTransport::progress_loop() {
  // UCX's CUDA transports may finish a device transfer on this thread: it works with the
  // endpoint's GPU current, as the stage threads that drive the worker do.
  if (options_.device.is_cuda()) c10::impl::VirtualGuardImpl(options_.device.type()).setDevice(options_.device);
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

void UcxTransport::wait(std::unique_lock<std::mutex>& lock, std::unique_ptr<Op>& op, int src,
                        const MessageId& id, Deadline deadline, const char* part) {
  ++waiters_;
  bool driving = false;
  ProbeWait probe(deadline);  // liveness.cpp
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
    } else if (advance_probe(probe, src, deadline)) {
      continue;
    } else if (deadline.passed()) {
      timeout = true;
      error = detail::concat("rank ", rank_, ": timed out waiting for ", part, id.describe(), " from rank ", src,
                             probe.verdict());
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
    const Clock::time_point next = probe.next_wake(deadline);
    if (driving) {
      drive(lock, next, true);
    } else {
      if (driver_ == Driver::ProgressThread) wake();  // asks it to hand over
      cv_.wait_until(lock, std::min(next, Clock::now() + std::chrono::milliseconds(kPollCapMs)));
    }
  }
}

}  // namespace pipetrain::comm::ucx
