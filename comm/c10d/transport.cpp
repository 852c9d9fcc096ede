// c10d: the Transport over c10d groups (comm/c10d/transport.h).
//
// Every message is a fixed-size header (comm/wire.h) and, unless empty, its payload: two c10d
// point-to-point messages to the peer, the header with one tag and the payload with another,
// posted back to back under one lock so that every peer sees them in order. The receiving side
// runs one thread per peer (a pump) that takes that peer's headers in order, validates each
// before it allocates anything, receives its payload, and files the message in a mailbox by its
// tag; recv() waits on the mailbox. That keeps c10d's rules out of the engine's way: Gloo matches
// by (peer, tag) and NCCL by order alone, and a message is always taken as soon as it arrives, so
// a send never waits for the receiver to ask for it, a receive can time out (or be aborted) and
// the transport still works, and a schedule may receive in any order. A peer's failure (a closed
// connection, a malformed header) ends its pump and fails the waits on that peer, naming it.
// A wait that nears its deadline pings its peer, whose pump answers, to tell a silent peer from
// a waiting one. Sends to this rank itself go straight to the mailbox. One more thread (the
// reaper) waits for the sends in order, keeping each tensor alive until its send completed.
//
// NCCL (and "nccl-order", its ordering rules on the CPU: nccl_order.h) runs the point-to-point
// operations of a pair on one stream per rank, in posting order, tags ignored: one rank's stream
// could hold [send activation m+1, receive gradient m] while its neighbour's holds [send gradient
// m, receive activation m+1], and neither would ever progress. So the data travels on two groups,
// one per direction (`up`: to a higher rank, `down`: to a lower one): on each, one side only
// sends, in the order it posts, and the other only receives, in the order the headers arrive,
// which is the same order (a header and its payload are posted back to back). The pump posts a
// data payload's receive and files the message at once with its work; recv() completes it on the
// caller's thread: for NCCL by making the caller's current stream (the stage's compute stream)
// wait for it, without a host wait; for nccl-order by a host wait bounded by the deadline.
#include "comm/c10d/transport.h"
#include "comm/c10d/nccl_order.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "common/error.h"
#include "common/log.h"

namespace pipetrain::comm {

namespace {

constexpr int kHeaderTag = 1, kPayloadTag = 2;
// The first message of every transfer is a frame of this size: the header, then, when the
// payload fits and travels through Gloo, the payload itself (one message instead of two, and no
// rendezvous for the second: Gloo sends a buffer only once its receiver has posted one).
constexpr size_t kFrameBytes = 512;
constexpr size_t kInlineBytes = kFrameBytes - kWireHeaderBytes;
constexpr size_t kPosted = 16;     // frames each pump keeps posted
constexpr size_t kLazySends = 32;  // sends in flight before the reaper waits for the oldest
// Headers with these tags are not messages: an abort notice (the sender aborted, its payload is
// the reason), and the liveness probe's ping and pong (no payload).
constexpr uint64_t kAbortNotice = uint64_t(0xff) << 56;
constexpr uint64_t kPing = uint64_t(0xfe) << 56;
constexpr uint64_t kPong = uint64_t(0xfd) << 56;
constexpr size_t kAbortReasonBytes = 400;  // inline in the frame
constexpr double kCloseSeconds = 5;           // bound on delivering what is in flight at destruction
constexpr double kAbortedCloseSeconds = 0.5;  // the same after an abort: peers stopped receiving
// c10d's own timeouts are never used: a Gloo operation that times out closes the pairs of its
// context, every peer's, losing what is still in flight to the others (an abort notice). Waits
// end by their deadlines here, by an abort or by the destructor instead.
constexpr auto kForever = std::chrono::hours(24 * 365);

struct Received {
  WireHeader header;
  at::Tensor tensor;
  c10::intrusive_ptr<c10d::Work> arriving;  // a data payload's receive, completed by recv()
};

bool is_data(uint64_t tag) {
  const auto kind = static_cast<Kind>(tag >> 56);
  return kind == Kind::Activation || kind == Kind::Grad;
}

class C10dTransport final : public Transport {
 public:
  C10dTransport(TransportOptions options, int rank, int world, ProcessGroup control, DataGroups data)
      : options_(std::move(options)),
        rank_(rank),
        world_(world),
        control_(std::move(control)),
        data_(std::move(data.up)),
        data_down_(data.down ? std::move(data.down) : data_),
        failed_(world),
        pongs_(world),
        listening_(world, std::vector<c10::intrusive_ptr<c10d::Work>>(kPosted + 1)) {
    for (int src = 0; src < world_; ++src)
      if (src != rank_) pumps_.emplace_back([this, src] { pump(src); });
    reaper_ = std::thread([this] { reap(); });
  }

  ~C10dTransport() override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      draining_ = true;
      cv_.notify_all();
      // What is in flight is delivered while the peers' pumps take it: within kCloseSeconds in
      // all, and never a second without one more send done (a peer that takes nothing left).
      const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                          aborted_ ? kAbortedCloseSeconds : kCloseSeconds));
      while (!sending_.empty() && Clock::now() < end) {
        const uint64_t before = sent_;
        const auto until = std::min(end, Clock::now() + std::chrono::seconds(1));
        cv_.wait_until(lock, until, [&] { return sending_.empty() || sent_ != before; });
        if (sent_ == before) break;
      }
      closing_ = true;
      for (auto& [dst, work] : sending_) work->abort();
      for (auto& works : listening_)
        for (auto& work : works)
          if (work) work->abort();
      for (auto& [key, box] : boxes_)
        for (auto& m : box)
          if (m.arriving) m.arriving->abort();
      cv_.notify_all();
    }
    reaper_.join();
    for (auto& t : pumps_) t.join();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return name(options_.backend); }
  // NCCL sends device memory; Gloo stages a GPU's tensor through pinned host memory (on_wire).
  bool takes(const c10::Device&) const override { return true; }

  void send(int dst, const MessageId& id, const at::Tensor& tensor) override {
    check_peer(dst);
    const WireHeader h = make_header(tensor, id);
    if (dst == rank_) {
      std::lock_guard<std::mutex> lock(mu_);
      check_sendable(dst, id);
      boxes_[{rank_, h.tag}].push_back({h, tensor, {}});
      cv_.notify_all();
      return;
    }
    at::Tensor payload;
    if (h.nbytes > 0) payload = on_wire(tensor, is_data(h.tag));
    std::lock_guard<std::mutex> order(send_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      check_sendable(dst, id);
    }
    post(dst, h, payload, id.describe());
  }

  // A wait whose deadline nears pings its peer (in the last quarter of the wait, at most a
  // second): a live peer's pump answers whatever the peer's stages are doing, a stopped or hung
  // one does not, and the error says which. A peer that answers is alive and waiting itself (its
  // own timeout will name the rank at fault), so the wait goes on once more.
  at::Tensor recv(int src, const MessageId& id, Deadline deadline) override {
    check_peer(src);
    const auto key = std::make_pair(src, id.tag());
    enum class Phase { Waiting, Probing, Extended } phase = Phase::Waiting;
    const Clock::duration length = deadline.at - Clock::now();
    const Clock::duration window =
        std::clamp<Clock::duration>(length / 4, Clock::duration::zero(), std::chrono::seconds(1));
    const Clock::time_point probe_at = deadline.at - window;
    uint64_t pongs_before = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      auto it = boxes_.find(key);
      if (it != boxes_.end() && !it->second.empty()) {
        Received m = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) boxes_.erase(it);
        lock.unlock();
        check_received(m.header, id, rank_, src);
        if (m.arriving) complete(m.arriving, src, id, deadline);
        return m.tensor;
      }
      if (aborted_)
        throw TransportError(src, detail::concat("rank ", rank_, ": aborted while waiting for ", id.describe(),
                                                 " from rank ", src, ": ", abort_reason_));
      if (!failed_[src].empty())
        throw TransportError(src, detail::concat("rank ", rank_, ": cannot receive ", id.describe(), " from rank ",
                                                 src, ": ", failed_[src]));
      const Clock::time_point now = Clock::now();
      if (phase == Phase::Probing && pongs_[src] > pongs_before) {
        phase = Phase::Extended;
        deadline.at += length;
        continue;
      }
      if (phase == Phase::Waiting && now >= probe_at && src != rank_ && window > Clock::duration::zero()) {
        phase = Phase::Probing;
        pongs_before = pongs_[src];
        lock.unlock();
        probe(src, kPing);
        lock.lock();
        continue;
      }
      if (now >= deadline.at)
        throw TimeoutError(src, detail::concat("rank ", rank_, ": timed out waiting for ", id.describe(), " from rank ",
                                               src,
                                               phase == Phase::Probing    ? ", which does not answer (stopped, hung or unreachable)"
                                               : phase == Phase::Extended ? " (it is alive but did not send it)"
                                                                          : ""));
      cv_.wait_until(lock, phase == Phase::Waiting ? std::min(deadline.at, probe_at) : deadline.at);
    }
  }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> order(send_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) return;
      aborted_ = true;
      abort_reason_ = reason;
      cv_.notify_all();
    }
    log::debug(detail::concat("rank ", rank_, ": aborting (", reason, ")"));
    // A receive that NCCL will never complete holds the GPU until the communicator is aborted.
    if (data_) {
      try {
        data_->abort();
        if (data_down_ != data_) data_down_->abort();
      } catch (const std::exception& e) {
        log::debug(detail::concat("rank ", rank_, ": aborting the data groups: ", error_reason(e)));
      }
    }
    // Every peer hears of it, so that their waits end too (best effort: a failed notice is no
    // worse than a silent peer, which their deadlines cover).
    const std::string text = reason.substr(0, kAbortReasonBytes);
    for (int dst = 0; dst < world_; ++dst) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (dst == rank_ || !failed_[dst].empty() || closing_) continue;
      }
      at::Tensor bytes = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
      if (!text.empty()) std::memcpy(bytes.data_ptr(), text.data(), text.size());
      WireHeader h = make_header(bytes, MessageId{Kind::Control, 0});
      h.tag = kAbortNotice;
      try {
        post(dst, h, text.empty() ? at::Tensor() : bytes, "an abort notice");
      } catch (const TransportError&) {
      }
    }
  }

 private:
  void check_peer(int peer) const {
    if (peer < 0 || peer >= world_)
      throw TransportError(peer, detail::concat("rank ", rank_, ": no rank ", peer, " in a world of ", world_));
  }

  // Under mu_.
  void check_sendable(int dst, const MessageId& id) const {
    if (aborted_)
      throw TransportError(dst, detail::concat("rank ", rank_, ": cannot send ", id.describe(), " to rank ", dst,
                                               ": aborted: ", abort_reason_));
    if (!failed_[dst].empty())
      throw TransportError(dst, detail::concat("rank ", rank_, ": cannot send ", id.describe(), " to rank ", dst,
                                               ": ", failed_[dst]));
  }

  // The bytes as the wire carries them: one flat, contiguous tensor, on the GPU for NCCL's data
  // and on the host for Gloo.
  at::Tensor on_wire(const at::Tensor& t, bool data) const {
    if (data_ && data) return t.to(options_.device).contiguous().view({-1});
    if (t.device().is_cpu()) return t.contiguous().view({-1});
    // From a GPU to Gloo: into pinned memory, after the work the current stream issued (the copy
    // waits for it, as Gloo reads the bytes from the host).
    at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
    host.copy_(t);
    return host.view({-1});
  }

  // The group a message between this rank and `peer` travels on; data to a higher rank goes up.
  c10d::Backend& group_for(uint64_t tag, int from, int to) const {
    if (!data_ || !is_data(tag)) return *control_;
    return from < to ? *data_ : *data_down_;
  }

  // A data payload's receive, on the caller's thread. NCCL: the caller's current stream waits for
  // it (c10d's wait() without a timeout blocks no host thread); nccl-order: a host wait.
  void complete(const c10::intrusive_ptr<c10d::Work>& work, int src, const MessageId& id, Deadline deadline) {
    try {
      if (stream_waits_)
        work->wait();
      else
        wait_work(work, deadline);
    } catch (const TimeoutError& e) {
      throw TimeoutError(src, detail::concat("rank ", rank_, ": timed out receiving ", id.describe(), " from rank ",
                                             src, ": ", e.what()));
    } catch (const std::exception& e) {
      throw TransportError(src, detail::concat("rank ", rank_, ": cannot receive ", id.describe(), " from rank ", src,
                                               ": ", error_reason(e)));
    }
  }

  // Whether a payload of this message travels inside its frame.
  bool inline_payload(const WireHeader& h) const { return h.nbytes <= kInlineBytes && !(data_ && is_data(h.tag)); }

  // Under send_mu_: the frame, then the payload (if any, and not inline), to `dst`.
  void post(int dst, const WireHeader& h, const at::Tensor& payload, const std::string& what) {
    const auto bytes = encode(h);
    at::Tensor header = at::zeros({static_cast<int64_t>(kFrameBytes)}, at::kByte);
    std::memcpy(header.data_ptr(), bytes.data(), kWireHeaderBytes);
    const bool in_frame = payload.defined() && inline_payload(h);
    if (in_frame) std::memcpy(header.data_ptr<uint8_t>() + kWireHeaderBytes, payload.data_ptr(), h.nbytes);
    c10::intrusive_ptr<c10d::Work> head, body;
    try {
      head = comm::send(*control_, header, dst, kHeaderTag);
      if (payload.defined() && !in_frame) {
        at::Tensor p = payload;
        body = comm::send(group_for(h.tag, rank_, dst), p, dst, kPayloadTag);
      }
    } catch (const std::exception& e) {
      throw TransportError(dst, detail::concat("rank ", rank_, ": cannot send ", what, " to rank ", dst, ": ",
                                               error_reason(e)));
    }
    std::lock_guard<std::mutex> lock(mu_);
    sending_.emplace_back(dst, head);
    if (body) sending_.emplace_back(dst, body);
    cv_.notify_all();
  }

  // A ping or a pong to `dst`, best effort: a failed one is reported by the wait it serves.
  void probe(int dst, uint64_t type) {
    WireHeader h = make_header(at::empty({0}, at::kByte), MessageId{Kind::Control, 0});
    h.tag = type;
    try {
      std::lock_guard<std::mutex> order(send_mu_);
      post(dst, h, at::Tensor(), type == kPing ? "a liveness ping" : "a liveness pong");
    } catch (const TransportError&) {
    }
  }

  // Posts a receive from `src` into `slot` of its pump's receives; false when the transport closes.
  bool post_receive(c10d::Backend& group, at::Tensor& into, int src, int tag, size_t slot) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return false;
    listening_[src][slot] = comm::recv(group, into, src, tag);
    return true;
  }

  // Waits for the receive in `slot`; false when the transport closes meanwhile. Throws what the
  // group throws.
  bool await_receive(int src, size_t slot) {
    c10::intrusive_ptr<c10d::Work> work;
    {
      std::lock_guard<std::mutex> lock(mu_);
      work = listening_[src][slot];
    }
    const bool done = work && work->wait(kForever);
    std::lock_guard<std::mutex> lock(mu_);
    return done && !closing_;
  }

  // The endpoint's device, and a CUDA stream of the transport's threads' own, current while they
  // post and wait (the pumps, the reaper): c10d makes NCCL's stream wait for the poster's current
  // stream, and a wait for a send makes the waiter's current stream wait for it. On the device's
  // default stream (which every stage's compute stream waits for at the start of each job,
  // stages/device.h) a wait for a send to a neighbour and a receive from that neighbour posted
  // after it could hold each other across two ranks. A high-priority stream of libtorch's pool:
  // none of the device contexts' (they take the others).
  void enter_device(std::optional<c10::DeviceGuard>& device, std::optional<c10::StreamGuard>& stream) const {
    if (!data_) return;
    device.emplace(options_.device);
    if (options_.device.is_cuda())
      stream.emplace(c10::impl::VirtualGuardImpl(options_.device.type())
                         .getStreamFromGlobalPool(options_.device, /*isHighPriority=*/true));
  }

  // Takes `src`'s messages in order. kPosted frames stay posted, so that a sender finds a
  // receive waiting (Gloo sends only into a posted receive; without one, each frame would wait a
  // round trip for the receiver's "ready"); the payload of a frame that does not carry it is
  // received right after it, into the last slot.
  void pump(int src) {
    std::optional<c10::DeviceGuard> on_device;
    std::optional<c10::StreamGuard> on_stream;
    enter_device(on_device, on_stream);
    try {
      std::vector<at::Tensor> frames(kPosted);
      for (size_t i = 0; i < kPosted; ++i) {
        frames[i] = at::empty({static_cast<int64_t>(kFrameBytes)}, at::kByte);
        if (!post_receive(*control_, frames[i], src, kHeaderTag, i)) return;
      }
      for (size_t i = 0;; i = (i + 1) % kPosted) {
        if (!await_receive(src, i)) return;
        const at::Tensor frame = frames[i];
        const WireHeader h = decode(frame.data_ptr<uint8_t>(), kWireHeaderBytes, options_.max_message_bytes, src);
        // NCCL's data into the GPU; Gloo's for a GPU endpoint into pinned memory, which the stage's
        // context copies to the GPU without holding its thread; the rest into pageable memory.
        const auto dtype = at::TensorOptions().dtype(scalar_type_of(h.dtype));
        at::Tensor t = data_ && is_data(h.tag)                       ? at::empty(h.dims, dtype.device(options_.device))
                       : is_data(h.tag) && options_.device.is_cuda() ? at::empty(h.dims, dtype.pinned_memory(true))
                                                                     : empty_for(h);
        c10::intrusive_ptr<c10d::Work> arriving;
        if (h.nbytes > 0 && inline_payload(h)) {
          std::memcpy(t.data_ptr(), frame.data_ptr<uint8_t>() + kWireHeaderBytes, h.nbytes);
        } else if (h.nbytes > 0 && data_ && is_data(h.tag)) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            if (closing_) return;
          }
          // Not under mu_: NCCL's first operation of a pair blocks until both ranks join its communicator.
          at::Tensor flat = t.view({-1});
          arriving = comm::recv(group_for(h.tag, src, rank_), flat, src, kPayloadTag);
        } else if (h.nbytes > 0) {
          at::Tensor flat = t.view({-1});
          if (!post_receive(*control_, flat, src, kPayloadTag, kPosted) || !await_receive(src, kPosted)) return;
        }
        frames[i] = at::empty({static_cast<int64_t>(kFrameBytes)}, at::kByte);
        if (!post_receive(*control_, frames[i], src, kHeaderTag, i)) return;
        if (h.tag == kAbortNotice || h.tag == kPing)
          log::debug(detail::concat("rank ", rank_, ": ", h.tag == kPing ? "a liveness ping" : "an abort notice",
                                    " from rank ", src));
        if (h.tag == kPing) {
          probe(src, kPong);
          continue;
        }
        std::lock_guard<std::mutex> lock(mu_);
        if (closing_) {
          if (arriving) arriving->abort();
          return;
        }
        if (h.tag == kPong) {
          ++pongs_[src];
        } else if (h.tag == kAbortNotice) {
          if (!aborted_) {
            aborted_ = true;
            abort_reason_ = std::string(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()));
          }
        } else {
          boxes_[{src, h.tag}].push_back({h, t, std::move(arriving)});
        }
        cv_.notify_all();
      }
    } catch (const std::exception& e) {
      log::debug(detail::concat("rank ", rank_, ": stopped receiving from rank ", src, ": ", e.what()));
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) return;
      const auto* transport = dynamic_cast<const TransportError*>(&e);
      failed_[src] = transport ? std::string(e.what())
                               : detail::concat("lost rank ", src, " (", error_reason(e), ")");
      cv_.notify_all();
    }
  }

  void reap() {
    std::optional<c10::DeviceGuard> on_device;
    std::optional<c10::StreamGuard> on_stream;
    enter_device(on_device, on_stream);
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      // Lazily: by the time a few sends have piled up the oldest are long delivered (the pumps
      // take every message as it comes), so waiting for them costs no thread switch per send.
      cv_.wait(lock, [&] { return sending_.size() > kLazySends || (draining_ && !sending_.empty()) || closing_; });
      if (sending_.empty()) return;
      auto [dst, work] = sending_.front();
      lock.unlock();
      std::string why;
      try {
        if (!work->wait(kForever)) why = "not delivered";
      } catch (const std::exception& e) {
        why = error_reason(e);
      }
      lock.lock();
      sending_.pop_front();
      ++sent_;
      if (!why.empty() && !closing_ && !aborted_ && failed_[dst].empty())
        failed_[dst] = detail::concat("rank ", dst, " did not take a message (", why, ")");
      cv_.notify_all();
    }
  }

  const TransportOptions options_;
  const int rank_, world_;
  const ProcessGroup control_, data_, data_down_;  // data_: up (or both directions, shared_p2p_stream)
  const bool stream_waits_ = options_.backend == Backend::Nccl;  // a data receive completes by a stream wait
  std::mutex send_mu_;  // a header and its payload leave back to back, in one order per peer
  std::mutex mu_;
  std::condition_variable cv_;  // mailboxes, failures, the abort, drained sends
  std::map<std::pair<int, uint64_t>, std::deque<Received>> boxes_;  // (src, tag)
  std::vector<std::string> failed_;                                  // per peer: why it cannot be heard
  std::vector<uint64_t> pongs_;                                      // per peer: liveness answers
  std::vector<std::vector<c10::intrusive_ptr<c10d::Work>>> listening_;  // per peer: the pump's receives
  std::deque<std::pair<int, c10::intrusive_ptr<c10d::Work>>> sending_;  // (dst, send) in order
  uint64_t sent_ = 0;  // sends completed (or failed) so far
  bool aborted_ = false, draining_ = false, closing_ = false;
  std::string abort_reason_;
  std::vector<std::thread> pumps_;
  std::thread reaper_;
};

}  // namespace

std::unique_ptr<Transport> make_c10d_transport(const TransportOptions& options, int rank, int world_size,
                                               ProcessGroup control, DataGroups data) {
  return std::make_unique<C10dTransport>(options, rank, world_size, std::move(control), std::move(data));
}

std::vector<std::unique_ptr<Transport>> make_local_c10d_group(const TransportOptions& options, int world_size) {
  if (options.backend != Backend::Gloo && options.backend != Backend::NcclOrder)
    throw ConfigError(std::string("comm: transport \"") + name(options.backend) +
                      "\" is not a c10d group of threads (gloo, nccl-order)");
  auto groups = make_local_gloo_groups(1, world_size, options.timeout_s);
  std::vector<ProcessGroup> up, down;
  if (options.backend == Backend::NcclOrder) {
    up = make_nccl_order_group(world_size);
    if (!options.shared_p2p_stream) down = make_nccl_order_group(world_size);
  }
  std::vector<std::unique_ptr<Transport>> endpoints;
  for (int r = 0; r < world_size; ++r) {
    DataGroups data;
    if (!up.empty()) data.up = up[r];
    if (!down.empty()) data.down = down[r];
    endpoints.push_back(make_c10d_transport(options, r, world_size, groups[0][r], std::move(data)));
  }
  return endpoints;
}

std::unique_ptr<Transport> make_group_transport(const TransportOptions& options,
                                                const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                                                int rank, int world_size, const std::string& interface) {
  if (!info(options.backend).c10d)
    throw ConfigError(std::string("comm: transport \"") + name(options.backend) + "\" (" + info(options.backend).help +
                      ") is not a c10d group of processes (gloo, nccl)");
  ProcessGroup control = make_gloo_group(store, prefix + "gloo/", rank, world_size, interface, options.timeout_s);
  DataGroups data;
  if (options.backend == Backend::Nccl) {
    // One group per direction (the note at the top of this file).
    data.up = make_nccl_group(store, prefix + "nccl-up/", rank, world_size, options.timeout_s);
    if (!options.shared_p2p_stream)
      data.down = make_nccl_group(store, prefix + "nccl-down/", rank, world_size, options.timeout_s);
  }
  return make_c10d_transport(options, rank, world_size, std::move(control), std::move(data));
}

}  // namespace pipetrain::comm
