// ucx: liveness probes of a UcxTransport (internal.h). A wait whose deadline nears pings its
// peer; a live peer (waiting or computing: its progress is driven either way) answers with a
// pong, a stopped or hung one does not, and the wait's error says which. A probe is
// kProbeBytes: the sender's rank and ping (0) or pong (1), on probe_tag(sender) (tags.h).
#include <algorithm>
#include <chrono>

#include "comm/ucx/internal.h"
#include "comm/ucx/tags.h"
#include "common/error.h"

namespace pipetrain::comm::ucx {

namespace {
constexpr size_t kProbeBytes = 8;  // sender rank and ping (0) or pong (1), two little-endian uint32
}  // namespace

UcxTransport::ProbeWait::ProbeWait(const Deadline& deadline)
    : length(deadline.at - Clock::now()),
      window(std::clamp<Clock::duration>(length / 4, Clock::duration::zero(), std::chrono::seconds(1))),
      probe_at(deadline.at - window) {}

Clock::time_point UcxTransport::ProbeWait::next_wake(const Deadline& deadline) const {
  return phase == Phase::Waiting ? std::min(deadline.at, probe_at) : deadline.at;
}

const char* UcxTransport::ProbeWait::verdict() const {
  return phase == Phase::Probing    ? ", which does not answer (stopped, hung or unreachable)"
         : phase == Phase::Extended ? " (it is alive but did not send it)"
                                    : "";
}

bool UcxTransport::advance_probe(ProbeWait& probe, int src, Deadline& deadline) {
  if (probe.phase == ProbeWait::Phase::Probing && peers_[src]->pongs > probe.pongs_before) {
    probe.phase = ProbeWait::Phase::Extended;
    deadline.at += probe.length;
    return true;
  }
  if (probe.phase == ProbeWait::Phase::Waiting && Clock::now() >= probe.probe_at && src != rank_ &&
      probe.window > Clock::duration::zero()) {
    probe.phase = ProbeWait::Phase::Probing;
    probe.pongs_before = peers_[src]->pongs;
    try {
      send_probe(src, 0);
    } catch (const TransportError&) {  // the next round reports the failed connection
    }
    wake();
    return true;
  }
  return false;
}

void UcxTransport::post_probe_recv() {
  probe_ = new_op(OpKind::Probe, -1, MessageId{Kind::Activation, 0}, "liveness probe");
  probe_->bytes.reset(new uint8_t[kProbeBytes]);
  post_recv(*probe_, probe_->bytes.get(), kProbeBytes, kProbeTag, kTypeMask);
}

void UcxTransport::send_probe(int dst, uint32_t type) {
  auto op = new_op(OpKind::Send, dst, MessageId{Kind::Activation, 0}, type == 0 ? "liveness ping" : "liveness pong");
  op->bytes.reset(new uint8_t[kProbeBytes]);
  for (int i = 0; i < 4; ++i) {
    op->bytes[i] = static_cast<uint8_t>(static_cast<uint32_t>(rank_) >> (8 * i));
    op->bytes[4 + i] = static_cast<uint8_t>(type >> (8 * i));
  }
  const uint8_t* buffer = op->bytes.get();
  post_send(std::move(op), dst, buffer, kProbeBytes, probe_tag(rank_));
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

}  // namespace pipetrain::comm::ucx
