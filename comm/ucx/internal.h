// ucx: UcxTransport, the backend's Transport, declared for the files that implement it; nothing
// outside comm/ucx/ includes this (transport.h is the backend's interface). Its member
// functions are split by concern:
//   transport.cpp  the protocol (send, recv: a header with inline or separate data), the UCP
//                  operations it posts and their completion callbacks, the factories
//   worker.cpp     the UCP context, worker and endpoints, and who drives the worker's progress:
//                  wait(), drive() and the progress thread
//   liveness.cpp   liveness probes: pings and pongs, and the probe phases of a wait
//   teardown.cpp   abort() and the abort notices, the bounded shutdown (destructor, release())
// process_watch.h says how peers on the same host are watched (a pidfd, not UCX's peer-failure
// mode), so that their endpoints may use shared memory.
// tags.h holds the tag layout, buffers.h the receive buffers of large messages.
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
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>
#include <ucp/api/ucp.h>

#include "comm/transport.h"
#include "comm/wire.h"
#include "common/deadline.h"

namespace pipetrain::comm::ucx {

// Data up to this size travels inside the header's message (one copy each way, one message);
// larger data is a message of its own, sent from and received into the tensor's memory.
constexpr size_t kInlineBytes = 8192;
constexpr size_t kHeaderBufferBytes = kWireHeaderBytes + kInlineBytes;
constexpr size_t kAbortReasonBytes = 1024;
constexpr int kProgressBatch = 1024;

// UCX's log messages as lines of common/log.h at the matching level, not UCX's own lines on
// stdout (log.cpp); once per process, before the first context. silence_ucx_log drops them all
// (the address check's child, whose parent reports what failed).
void route_ucx_log();
void silence_ucx_log();

// A child process that unpacks every peer's address (all but `self`'s) as this rank's worker
// would, so that a forged one is refused naming the rank that published it instead of aborting
// this process inside UCX (address_check.cpp: this program run again). check() once, which
// throws TransportError naming that rank.
class AddressCheck {
 public:
  AddressCheck();
  ~AddressCheck();
  AddressCheck(const AddressCheck&) = delete;
  AddressCheck& operator=(const AddressCheck&) = delete;
  void check(const std::vector<std::string>& addresses, int self);

 private:
  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1;
};

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
  // A GPU's tensor is brought to the host by send() itself, after the current stream's work.
  bool takes(const c10::Device&) const override { return true; }
  void send(int dst, const MessageId& id, const at::Tensor& tensor) override;
  at::Tensor recv(int src, const MessageId& id, Deadline deadline) override;
  void abort(const std::string& reason) override;

  void send_raw_header(int dst, const MessageId& id, const std::string& bytes);
  // UCX's description of the endpoint to `peer` (its lanes and transports), for tests.
  std::string describe_endpoint(int peer);

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
    std::string failure;  // set by the endpoint's error callback, or when its process exits
    uint64_t pongs = 0;   // answers to this rank's liveness probes
    bool ucx_detects = false;  // its endpoint is in UCX's peer-failure mode
    int pidfd = -1;            // or its process is watched (process_watch.h)
    long pid = -1;
  };
  // The liveness side of one wait() (liveness.cpp). The last quarter of the wait (at most a
  // second) probes the peer. No answer by the deadline: it stopped answering, and the error
  // says so. An answer: it is alive and itself waiting (e.g. on a rank that stopped), so this
  // wait goes on once more for as long, and the abort notice of the rank that times out first,
  // naming the rank at fault, ends it; or it times out again.
  struct ProbeWait {
    explicit ProbeWait(const Deadline& deadline);
    Clock::time_point next_wake(const Deadline& deadline) const;  // when the wait must look again
    const char* verdict() const;  // what a timeout adds to its error: whether the peer answered

    Clock::duration length;  // the wait's, by which an answer extends it
    Clock::duration window;  // the probing part of it
    Clock::time_point probe_at;
    enum class Phase { Waiting, Probing, Extended } phase = Phase::Waiting;
    uint64_t pongs_before = 0;
  };

  static void on_send(void* request, ucs_status_t status, void* user);
  static void on_recv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  void send_done(Op* op, void* request, ucs_status_t status);
  void recv_done(Op* op, void* request, ucs_status_t status, const ucp_tag_recv_info_t* info);

  // All of these expect `mu_` to be held.
  void post_send(std::unique_ptr<Op> op, int dst, const void* buffer, size_t size, uint64_t tag,
                 ucs_memory_type_t memory = UCS_MEMORY_TYPE_HOST);
  void post_recv(Op& op, void* buffer, size_t size, uint64_t tag, uint64_t mask,
                 ucs_memory_type_t memory = UCS_MEMORY_TYPE_HOST);
  void wait(std::unique_lock<std::mutex>& lock, std::unique_ptr<Op>& op, int src, const MessageId& id,
            Deadline deadline, const char* part);
  void give_up(std::unique_ptr<Op> op);
  // A message whose header was received before its recv() asked for it (read_ahead), with the
  // receive of its data posted where it travels apart and its header decoded.
  struct Ahead {
    size_t length = 0;  // the header message's length, as the probe saw it
    std::unique_ptr<Op> head, body;  // no head: no entry
    at::Tensor out;                  // body's buffer
  };
  void read_ahead(int src);
  Ahead take_ahead(uint64_t tag);
  at::Tensor buffer_for(const WireHeader& h, Kind kind);
  WireHeader checked_header(const Op& head, int src, const MessageId& id) const;
  // Throws once aborted, after a failed send, or when not connected; `doing()` says what failed.
  template <typename Doing>
  void check_usable(int peer, const Doing& doing) const;
  void post_abort_notice_recv();
  // Liveness probes: a wait whose deadline passes pings its peer. A live peer (waiting or
  // computing: its progress is driven either way) answers; a stopped or hung one does not.
  void post_probe_recv();
  void send_probe(int dst, uint32_t type);
  void service_probes();  // handles received probes, answers pings, reposts the receive
  // Moves the probing of a wait on `src` on: an answer extends `deadline`, the probe time sends
  // a ping. True when it did either, and the caller looks at everything again.
  bool advance_probe(ProbeWait& probe, int src, Deadline& deadline);

  void check_peer(int peer) const;
  std::unique_ptr<Op> new_op(OpKind kind, int peer, const MessageId& id, const char* label = nullptr);
  void mark_aborted(std::string reason);
  void wake();
  // One round of driving the worker with `lock` held on entry and exit: progress (spinning a
  // while, the lock released between rounds), then, if nothing happened, arm the worker and
  // sleep in poll() (lock released) until an event, a wake-up, `until` or the poll cap.
  // `abortable` also wakes on an abort. The progress thread returns at once when a stage waits.
  void drive(std::unique_lock<std::mutex>& lock, Clock::time_point until, bool abortable);
  // Marks the watched peers whose process has exited (pidfd readable in `fds`) as failed.
  void note_exits(const std::vector<struct pollfd>& fds, size_t first);
  void progress_loop();
  void release();

  const int rank_, world_;
  const TransportOptions options_;
  // Where a GPU endpoint's device receives are allocated (transport.cpp's recv): a high-priority
  // stream of libtorch's pool, which runs no kernel (the device contexts take low-priority ones).
  std::optional<c10::Stream> receive_stream_;
  // CUDA tensors leave and arrive as device memory: UCX built with CUDA, a GPU endpoint, and the
  // UCX loaded at run time handling CUDA memory (a UCX without its CUDA module, or an older one
  // found first on the library path, does not: they then cross through the host, said once).
  bool device_memory_ = false;
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
  // Who drives the worker now (worker.cpp explains the hand-over).
  enum class Driver { None, ProgressThread, Waiter } driver_ = Driver::None;
  int waiters_ = 0;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::map<Op*, std::unique_ptr<Op>> pending_;
  std::map<uint64_t, std::deque<Ahead>> ahead_;  // by header tag, oldest first
  std::map<int, int> read_ahead_held_;            // entries of ahead_ per source rank
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

}  // namespace pipetrain::comm::ucx
