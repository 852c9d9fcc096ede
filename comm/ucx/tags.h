// ucx: the layout of the 64-bit UCP tags the backend sends with, and the functions that build
// them. Every tag of the backend is made here.
//
//   bit 63        a data message (the data of a message, apart from its header)
//   bits 63 + 62  an abort notice
//   bit 62 alone  a liveness probe (ping or pong)
//   bits 48-61    the sender's rank
//   bits 46-47    the message's kind
//   bits 32-45    the chunk
//   bits 0-31     the micro-batch
//
// Whether data follows its header inside the same message is decided by the header's byte
// count alone (UCX 1.13 does not report the sender's tag reliably for a receive that matches at
// once, so nothing relies on it).
#pragma once

#include <cstdint>

#include "comm/transport.h"
#include "common/error.h"

namespace pipetrain::comm::ucx {

constexpr int kRankShift = 48;
constexpr int kRankBits = 14;
constexpr int kKindShift = 46;
constexpr int kChunkShift = 32;
constexpr int kChunkBits = 14;
constexpr int kMaxWorld = 1 << kRankBits;
constexpr uint64_t kDataBit = uint64_t(1) << 63;
constexpr uint64_t kAbortTag = kDataBit | (uint64_t(1) << 62);
constexpr uint64_t kProbeTag = uint64_t(1) << 62;
constexpr uint64_t kTypeMask = kAbortTag;  // the bits that tell headers, data, abort notices and probes apart
constexpr uint64_t kRankMask = uint64_t(kMaxWorld - 1) << kRankShift;  // UCP's tag_sender_mask
constexpr uint64_t kAllBits = ~uint64_t(0);

// The kind, chunk and micro-batch bits of `id`; throws for what the tag cannot hold.
inline uint64_t message_bits(const MessageId& id) {
  const auto kind = static_cast<uint64_t>(id.kind);
  if (kind > 3 || id.chunk < 0 || id.chunk >= (1 << kChunkBits))
    throw Error(
        detail::concat("ucx: cannot tag ", id.describe(), ": chunk must be in [0, ", 1 << kChunkBits, ")"));
  return (kind << kKindShift) | (static_cast<uint64_t>(id.chunk) << kChunkShift) |
         static_cast<uint32_t>(id.micro_batch);
}

inline uint64_t rank_bits(int src) { return static_cast<uint64_t>(src) << kRankShift; }

// The header of message `id` sent by `src` (with its data too when that is inline).
inline uint64_t header_tag(int src, const MessageId& id) { return rank_bits(src) | message_bits(id); }

// The data of the message whose header went with `header`, when it travels on its own.
inline uint64_t data_tag(uint64_t header) { return header | kDataBit; }

// An abort notice from `src`; received with the mask kTypeMask, from any rank.
inline uint64_t abort_notice_tag(int src) { return kAbortTag | rank_bits(src); }

// A liveness ping or pong from `src`; received with the mask kTypeMask, from any rank.
inline uint64_t probe_tag(int src) { return kProbeTag | rank_bits(src); }

}  // namespace pipetrain::comm::ucx
