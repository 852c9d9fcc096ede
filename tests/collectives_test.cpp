// The control plane (comm/collectives.h) over every transport backend compiled in: results,
// sequence numbers, a rank out of step, a failed rank, and the group of one.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>

#include <ATen/ATen.h>

#include "comm/collectives.h"
#include "comm/transport.h"
#include "common/error.h"

using namespace pipetrain;
using namespace pipetrain::comm;

namespace {

// Runs body(rank, group) on `world` threads, one endpoint each; returns each rank's error ("" if none).
std::vector<std::string> on_ranks(const std::string& backend, int world, double timeout_s,
                                  const std::function<void(int, Collectives&)>& body) {
  TransportOptions o;
  o.backend = pipetrain::comm::parse_backend(backend);
  auto endpoints = make_transport_group(o, world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      Collectives group(*endpoints[r], timeout_s);
      try {
        body(r, group);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();  // every wait inside is bounded by timeout_s
  return errors;
}

class Collectives_ : public ::testing::TestWithParam<std::string> {};

TEST_P(Collectives_, GatherBroadcastAnyBarrier) {
  for (int world : {2, 3, 4}) {
    SCOPED_TRACE("world " + std::to_string(world));
    const auto errors = on_ranks(GetParam(), world, 30, [&](int r, Collectives& g) {
      EXPECT_EQ(g.rank(), r);
      EXPECT_EQ(g.world_size(), world);
      const auto all = g.all_gather(std::vector<double>{double(r), r * 10.0 + 0.5}, "a test gather");
      ASSERT_EQ(all.size(), size_t(world));
      for (int d = 0; d < world; ++d) EXPECT_EQ(all[d], (std::vector<double>{double(d), d * 10.0 + 0.5}));
      // Tensors of different shapes per rank.
      const auto shaped = g.all_gather(at::arange(r + 1, at::kLong), "shaped");
      for (int d = 0; d < world; ++d) EXPECT_TRUE(shaped[d].equal(at::arange(d + 1, at::kLong)));
      const int root = world - 1;
      const auto b = g.broadcast(r == root ? std::vector<double>{3.25, -1} : std::vector<double>{}, root, "a value");
      EXPECT_EQ(b, (std::vector<double>{3.25, -1}));
      EXPECT_FALSE(g.any(false, "nobody"));
      EXPECT_TRUE(g.any(r == 1, "rank 1 only"));
      g.barrier();
      EXPECT_EQ(g.sequence(), 6);
      EXPECT_EQ(g.failure(), "");
    });
    for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  }
}

// A rank that makes another call than its peers (here a barrier against an all-gather) never
// gets the other's message: both fail by their deadline, naming the exchange and the peer,
// instead of pairing two different exchanges.
TEST_P(Collectives_, RanksOutOfStepFailInsteadOfMixingExchanges) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto errors = on_ranks(GetParam(), 2, 1.0, [&](int r, Collectives& g) {
    if (r == 0)
      g.all_gather(std::vector<double>{1}, "the step's losses");
    else
      g.barrier("the end of the run");
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  EXPECT_NE(errors[0].find("the step's losses"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("rank 1"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1], "");
}

// A rank that fails aborts the group: its peers, waiting in a collective, fail at once with an
// error naming it, and nobody can use the group afterwards.
TEST_P(Collectives_, AFailedRankEndsTheGroupEverywhere) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto errors = on_ranks(GetParam(), 3, 60, [&](int r, Collectives& g) {
    if (r == 2) {
      g.barrier();
      g.abort("its data file is unreadable");
      EXPECT_THROW(g.barrier(), Error);  // unusable after its own abort
      return;
    }
    try {
      g.barrier();  // may already fail, if rank 2 aborts before this rank heard from it
      g.all_gather(std::vector<double>{1}, "the checkpoint shards");
      ADD_FAILURE() << "rank " << r << ": the gather succeeded without rank 2";
    } catch (const TransportError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 2 failed: its data file is unreadable"), std::string::npos)
          << e.what();
    }
    EXPECT_NE(g.failure(), "");
    g.barrier();  // throws: the group cannot continue
  });
  // Well before the 60 s deadline: the abort notice ends the waits.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  for (int r : {0, 1}) {
    EXPECT_NE(errors[r].find("cannot continue after an earlier failure"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("rank 2 failed: its data file is unreadable"), std::string::npos) << errors[r];
  }
  EXPECT_EQ(errors[2], "");
}

TEST_P(Collectives_, BadRootIsAnError) {
  const auto errors = on_ranks(GetParam(), 2, 10, [&](int, Collectives& g) {
    g.broadcast(std::vector<double>{1}, 5, "a value");
  });
  for (const auto& e : errors) EXPECT_NE(e.find("root rank 5 outside a world of 2"), std::string::npos) << e;
}

// Every backend whose ranks can be threads of one process (NCCL takes one GPU per process).
std::vector<std::string> in_process_backends() {
  std::vector<std::string> v;
  for (const auto& b : transport_backends())
    if (b != "nccl") v.push_back(b);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Backends, Collectives_, ::testing::ValuesIn(in_process_backends()), [](const auto& info) {
  std::string name = info.param;  // "nccl-order": gtest names take no '-'
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
});

// In-process, every device is in this process: a group of one, whose calls are trivial.
TEST(Collectives, GroupOfOne) {
  Collectives g;
  EXPECT_EQ(g.rank(), 0);
  EXPECT_EQ(g.world_size(), 1);
  EXPECT_EQ(g.all_gather(std::vector<double>{1, 2}, "x"), (std::vector<std::vector<double>>{{1, 2}}));
  EXPECT_EQ(g.broadcast(std::vector<double>{4}, 0, "x"), (std::vector<double>{4}));
  EXPECT_TRUE(g.any(true, "x"));
  g.barrier();
  g.abort("stopped");
  EXPECT_EQ(g.failure(), "stopped");
  EXPECT_THROW(g.barrier(), Error);
}

// The control messages carry the operation as their channel and the sequence number as their
// place, so two different operations at the same point of the sequence never match.
TEST(Collectives, MessagesAreTaggedByOperationAndSequence) {
  const MessageId a = collective_message(Collective::AllGather, 7, "the step's losses");
  const MessageId b = collective_message(Collective::Barrier, 7);
  const MessageId c = collective_message(Collective::AllGather, 8);
  EXPECT_NE(a.tag(), b.tag());
  EXPECT_NE(a.tag(), c.tag());
  EXPECT_EQ(a.step, 7);
  EXPECT_EQ(a.describe(), "the step's losses (control message 7)");
  EXPECT_EQ(b.describe(), "control message 7 on channel 3");
}

}  // namespace
