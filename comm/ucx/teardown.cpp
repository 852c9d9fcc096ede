// ucx: how a UcxTransport (internal.h) ends. abort() fails every wait and sends every peer an
// abort notice (abort_notice_tag(), tags.h) carrying the reason, so that their waits end too;
// the destructor delivers what is still in flight and closes the endpoints, both bounded in
// time, stops the progress thread and frees the worker and context (release()).
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "comm/ucx/internal.h"
#include "comm/ucx/tags.h"

namespace pipetrain::comm::ucx {

namespace {
constexpr double kCloseSeconds = 5;           // bound on flushing and closing endpoints at destruction
constexpr double kAbortedCloseSeconds = 0.5;  // the same after an abort: peers stopped receiving
}  // namespace

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
      post_send(std::move(op), peer->rank, buffer, n, abort_notice_tag(rank_));
    } catch (const TransportError&) {
    }
  }
  wake();
}

void UcxTransport::mark_aborted(std::string reason) {
  aborted_ = true;
  abort_reason_ = std::move(reason);
  const uint64_t one = 1;
  (void)!::write(abort_fd_, &one, sizeof one);  // wakes a driver asleep in poll()
  cv_.notify_all();
}

// A notice, once received, aborts this transport too (recv_done).
void UcxTransport::post_abort_notice_recv() {
  abort_notice_ = new_op(OpKind::AbortNotice, -1, MessageId{Kind::Activation, 0}, "abort notice");
  abort_notice_->bytes.reset(new uint8_t[kAbortReasonBytes]);
  post_recv(*abort_notice_, abort_notice_->bytes.get(), kAbortReasonBytes, kAbortTag, kTypeMask);
}

UcxTransport::~UcxTransport() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    closing_ = true;
    // Sends still in flight are delivered first (bounded); after an abort nobody waits for them.
    if (!aborted_)
      cv_.wait_until(lock, Deadline::after(kCloseSeconds).at, [&] { return sends_in_flight_ == 0; });
    // A forced close needs peer-failure mode on both sides; without it endpoints are flushed.
    // A watched peer (process_watch.h) has none: its endpoint is flushed, unless its process
    // has gone, when nothing can be flushed and release() drops the endpoint.
    const bool force = aborted_ || sends_in_flight_ > 0;
    for (auto& peer : peers_) {
      if (!peer->ep || (peer->pidfd >= 0 && !peer->failure.empty())) continue;
      auto op = new_op(OpKind::Close, peer->rank, MessageId{Kind::Activation, 0}, "endpoint close");
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = force && peer->ucx_detects ? UCP_EP_CLOSE_FLAG_FORCE : 0;
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
    // Messages read ahead that nobody received: their receives still in flight are given up.
    for (auto& [tag, queue] : ahead_)
      for (Ahead& a : queue)
        for (std::unique_ptr<Op>* op : {&a.head, &a.body})
          if (*op) give_up(std::move(*op));
    ahead_.clear();
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
  for (auto& peer : peers_)
    if (peer->pidfd >= 0) {
      ::close(peer->pidfd);
      peer->pidfd = -1;
    }
  for (int* fd : {&wake_fd_, &abort_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

}  // namespace pipetrain::comm::ucx
