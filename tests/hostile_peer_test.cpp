// A peer that passes the rendezvous of a multi-process job and then sends malformed headers:
// the pipetrain rank refuses each before allocating anything, names the peer and exits with
// status 1; it never crashes or hangs. Each rank runs under a deadline and is killed when it
// passes.
#include <gtest/gtest.h>

#include <random>

#include <torch/torch.h>

#include "comm/collectives.h"
#include "comm/rendezvous.h"
#include "comm/transport.h"
#include "comm/wire.h"
#include "common/config.h"
#include "common/error.h"
#if PIPETRAIN_HAVE_UCX
#include "comm/ucx/testing.h"
#endif
#include "job/config.h"
#include "train/trainer.h"
#include "tests/ranks.h"

using namespace pipetrain::test;
using pipetrain::detail::concat;

#if PIPETRAIN_HAVE_UCX
namespace {
// Plays rank 1 of a two-rank job whose rank 0 is `ranks[0]`: passes the rendezvous on `port`
// with the config `hash`, sends `header` where message `id` belongs, and waits up to 30 s for
// rank 0 to exit (false if it did not).
template <typename Header>
bool hostile_rank1(std::vector<Rank>& ranks, int port, const std::string& hash, const pipetrain::comm::MessageId& id,
                   const Header& header) {
  namespace comm = pipetrain::comm;
  const auto t0 = Clock::now();
  comm::RankInfo info;
  info.rank = 1;
  info.world_size = 2;
  info.master_port = port;
  comm::TransportOptions options;
  options.backend = pipetrain::comm::Backend::Ucx;
  auto peer = comm::make_process_transport(options, 1, 2, comm::store_exchange(info, hash, pipetrain::Deadline::after(30)));
  comm::send_raw_header_for_test(*peer, 0, id, std::string(header.begin(), header.end()));
  return wait_ranks(ranks, {}, t0, 30);
}
}  // namespace

// Random headers from a peer that passed the rendezvous: `PIPETRAIN_HOSTILE_HEADERS` of them
// (default 4; fuzz/hostile.py runs hundreds), each mutating a valid header at random places
// (or replacing it whole). Rank 0 must exit with status 1 naming rank 1, never crash or hang.
TEST(HostilePeer, RandomHeadersAreRefused) {
  namespace comm = pipetrain::comm;
  const char* count_env = std::getenv("PIPETRAIN_HOSTILE_HEADERS");
  const int count = count_env ? std::atoi(count_env) : 4;
  const std::string cfg = write_file("random_headers.json", kMlp);
  const pipetrain::job::Config config =
      pipetrain::job::load_config(cfg, {"runtime.kind=processes", "runtime.timeout_s=10"});
  const std::string hash = pipetrain::job::run_fingerprint(config, pipetrain::train::train_run_options({}));
  const comm::MessageId id = comm::collective_message(comm::Collective::AllGather, 0);
  const auto good = comm::encode(comm::make_header(at::zeros({2}, at::kLong), id));
  std::mt19937_64 rng(20261123);
  int crashed = 0, hung = 0;
  for (int i = 0; i < count; ++i) {
    auto bytes = good;
    if (rng() % 8 == 0) {
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    } else {
      for (int k = 1 + static_cast<int>(rng() % 4); k > 0; --k) bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
    }
    if (bytes == good) bytes[6] ^= 0x40;  // always a change
    SCOPED_TRACE(concat("case ", i));
    const int port = free_port();
    std::vector<Rank> ranks{spawn({pipetrain_binary(), "train", cfg, "--quiet", "--set", "runtime.kind=processes",
                                   "--set", "runtime.timeout_s=10"},
                                  rank_env(0, 2, port), temp("random_header_0.txt"))};
    const bool exited = hostile_rank1(ranks, port, hash, id, bytes);
    const std::string out = ranks[0].out();
    if (!exited) ++hung;
    if (ranks[0].status > 128) ++crashed;
    EXPECT_EQ(ranks[0].status, 1) << out;
    EXPECT_NE(out.find("from rank 1"), std::string::npos) << out;
  }
  EXPECT_EQ(crashed, 0);
  EXPECT_EQ(hung, 0);
  std::printf("%d random headers: %d crashed, %d hung\n", count, crashed, hung);
}

TEST(HostilePeer, MalformedHeadersAreRefused) {
  namespace comm = pipetrain::comm;
  const std::string cfg = write_file("hostile.json", kMlp);
  const pipetrain::job::Config config = pipetrain::job::load_config(cfg, {"runtime.kind=processes"});
  const std::string hash = pipetrain::job::run_fingerprint(config, pipetrain::train::train_run_options({}));
  // The header of the first message rank 0 waits for: rank 1's part of the layout exchange.
  const comm::MessageId id = comm::collective_message(comm::Collective::AllGather, 0);
  const auto good = comm::encode(comm::make_header(at::zeros({2}, at::kLong), id));
  struct Case {
    const char* what;
    size_t at;
    std::vector<uint8_t> bytes;
    const char* expect;
  };
  const std::vector<Case> cases{
      {"bad magic", 0, {0xde, 0xad, 0xbe, 0xef}, "bad magic"},
      {"unknown dtype", 6, {0x77}, "unknown dtype"},
      {"huge dim", 8, {0, 0, 0, 0, 0, 1, 0, 0}, "exceeds the message limit"},
      {"negative dim", 8, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, "negative dim 0: -1"},
      // The byte count (after magic, version, dtype, ndim and 8 dims) over runtime.max_message_bytes.
      {"byte count over the limit", 8 + 8 * 8, {0, 0, 0, 0, 0, 1, 0, 0}, "exceed the message limit"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const int port = free_port();
    std::vector<Rank> ranks{spawn({pipetrain_binary(), "train", cfg, "--quiet", "--set", "runtime.kind=processes"},
                                  rank_env(0, 2, port), temp("hostile_0.txt"))};
    auto bytes = good;
    std::copy(c.bytes.begin(), c.bytes.end(), bytes.begin() + static_cast<long>(c.at));
    EXPECT_TRUE(hostile_rank1(ranks, port, hash, id, bytes));
    const std::string out = ranks[0].out();
    EXPECT_EQ(ranks[0].status, 1) << out;
    EXPECT_NE(out.find("invalid message header from rank 1"), std::string::npos) << out;
    EXPECT_NE(out.find(c.expect), std::string::npos) << out;
  }
}
#endif
