// UCX between processes of one host (a forked peer, its address exchanged over a socketpair):
// a peer that dies ends waits on it, and same-host peers talk over shared memory whether or not
// peer failures are detected (comm/ucx/process_watch.h); peers whose records name another host
// keep UCX's peer-failure mode, and an address without a record is refused naming its rank.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include <torch/torch.h>

#include "comm/transport.h"
#include "common/config.h"
#include "common/error.h"
#include "tests/helpers.h"

#if PIPETRAIN_HAVE_UCX
#include "comm/ucx/process_watch.h"
#include "comm/ucx/testing.h"
#include "comm/ucx/transport.h"

using namespace pipetrain;
using namespace pipetrain::comm;

namespace {

constexpr double kWait = 20;  // seconds; far longer than any healthy wait here

MessageId act(int m) { return {Kind::Activation, m, 0, 0}; }

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

TransportOptions ucx(bool detect) {
  TransportOptions o;
  o.backend = pipetrain::comm::Backend::Ucx;
  o.detect_peer_failure = detect;
  return o;
}

// Both ends of a socketpair write their address, then read the other's.
AddressExchange socket_exchange(int fd, int rank) {
  return [fd, rank](const std::string& mine) {
    auto io = [](ssize_t n, size_t want) {
      if (n != static_cast<ssize_t>(want)) throw Error("address exchange over the socketpair failed");
    };
    const uint64_t len = mine.size();
    io(::write(fd, &len, sizeof len), sizeof len);
    io(::write(fd, mine.data(), mine.size()), mine.size());
    uint64_t other_len = 0;
    io(::recv(fd, &other_len, sizeof other_len, MSG_WAITALL), sizeof other_len);
    if (other_len > 65536) throw Error("implausible address length");
    std::string other(other_len, '\0');
    io(::recv(fd, other.data(), other.size(), MSG_WAITALL), other.size());
    std::vector<std::string> all(2);
    all[rank] = mine;
    all[1 - rank] = other;
    return all;
  };
}

// Forks rank 1, which runs `rank1` on its end of a socketpair and exits 0 when it returns, 1
// when it throws (60 s at most); returns its pid (-1 when the fork failed) and rank 0's end.
std::pair<pid_t, int> fork_rank1(const std::function<void(int)>& rank1) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return {-1, -1};
  const pid_t child = ::fork();
  if (child == 0) {
    ::alarm(60);
    ::close(fds[0]);
    int rc = 1;
    try {
      rank1(fds[1]);
      rc = 0;
    } catch (...) {
    }
    ::_exit(rc);
  }
  ::close(fds[1]);
  if (child < 0) ::close(fds[0]);
  return {child, child < 0 ? -1 : fds[0]};
}

// A peer process that dies (SIGKILL) while this rank waits for it: with peer-failure detection
// the wait ends at once with an error naming the rank; without, at its deadline; either way
// the transport is then destroyed within a bounded time.
class UcxDeadPeer : public ::testing::TestWithParam<bool> {};

TEST_P(UcxDeadPeer, WaitEndsNamingTheRank) {
  const bool detect = GetParam();
  const auto [child, fd] = fork_rank1([&](int end) {  // connects, sends one message, waits to be killed
    auto t = make_ucx_transport(1, 2, socket_exchange(end, 1), ucx(detect));
    t->send(0, act(0), torch::full({4}, 7.0));
    t->recv(0, act(1), Deadline::after(60));
  });
  ASSERT_GE(child, 0);
  {
    auto t = make_ucx_transport(0, 2, socket_exchange(fd, 0), ucx(detect));
    EXPECT_EQ(t->recv(1, act(0), Deadline::after(kWait))[0].item<float>(), 7.0f);
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    const double deadline_s = detect ? 30 : 2;
    const auto t0 = Clock::now();
    int peer = -1;
    const std::string err = test::transport_error_of([&] { t->recv(1, act(2), Deadline::after(deadline_s)); }, &peer);
    EXPECT_EQ(peer, 1) << err;
    EXPECT_NE(err.find("rank 1"), std::string::npos) << err;
    if (detect) {  // the peer's process is watched (process_watch.h): its exit ends the wait
      EXPECT_LT(seconds_since(t0), 10.0) << err;
      EXPECT_NE(err.find("its process (pid " + std::to_string(child) + ") exited"), std::string::npos) << err;
    }
    std::printf("dead peer, detection %s: %s\n", detect ? "on" : "off", err.c_str());
    const auto t1 = Clock::now();
    t.reset();
    EXPECT_LT(seconds_since(t1), 12.0) << "destruction took too long";
  }
  ::close(fd);
}

INSTANTIATE_TEST_SUITE_P(FailureDetection, UcxDeadPeer, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "on" : "off";
                         });

// Two processes of this host: whether or not peer failures are detected, their endpoints use
// shared memory (UCX 1.13 in peer-failure mode would use tcp over loopback), and messages of
// both protocols (inline and separate data) travel.
class UcxSameHost : public ::testing::TestWithParam<bool> {};

TEST_P(UcxSameHost, PeerProcessesTalkOverSharedMemory) {
  const bool detect = GetParam();
  const auto [child, fd] = fork_rank1([&](int end) {  // echoes two messages back
    auto t = make_ucx_transport(1, 2, socket_exchange(end, 1), ucx(detect));
    for (int m = 0; m < 2; ++m) t->send(0, act(m), t->recv(0, act(m), Deadline::after(kWait)));
  });
  ASSERT_GE(child, 0);
  {
    auto t = make_ucx_transport(0, 2, socket_exchange(fd, 0), ucx(detect));
    const std::string ep = ucx_endpoint_for_test(*t, 1);
    EXPECT_NE(ep.find("/memory"), std::string::npos) << ep;
    EXPECT_EQ(ep.find("tcp/"), std::string::npos) << ep;
    const at::Tensor small = torch::arange(16, torch::kFloat), large = torch::arange(1 << 20, torch::kFloat);
    t->send(1, act(0), small);
    t->send(1, act(1), large);
    EXPECT_TRUE(torch::equal(t->recv(1, act(0), Deadline::after(kWait)), small));
    EXPECT_TRUE(torch::equal(t->recv(1, act(1), Deadline::after(kWait)), large));
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ::close(fd);
}

INSTANTIATE_TEST_SUITE_P(FailureDetection, UcxSameHost, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "on" : "off";
                         });

// Ranks as threads of one process exchange addresses in memory; `edit` may change what rank 1
// published before every rank reads it.
std::vector<std::unique_ptr<Transport>> threads_group(const std::function<void(std::string&)>& edit) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> table(2);
  int published = 0;
  std::vector<std::unique_ptr<Transport>> g(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      g[r] = make_ucx_transport(r, 2, [&](const std::string& mine) {
        std::unique_lock<std::mutex> lock(mu);
        table[r] = mine;
        if (r == 1) edit(table[r]);
        ++published;
        cv.notify_all();
        if (!cv.wait_for(lock, std::chrono::seconds(20), [&] { return published == 2; }))
          throw TimeoutError(-1, "address exchange timed out");
        std::vector<std::string> all = table;
        all[r] = mine;  // each rank checks that its own address came back unchanged
        return all;
      }, ucx(true));
    });
  for (auto& t : threads) t.join();
  return g;
}

// A peer in this process needs no watching and gets shared memory; one whose record names
// another host (another boot) cannot be watched and keeps UCX's peer-failure mode (tcp here).
TEST(UcxSameHost, OnlyPeersOfThisHostSkipThePeerFailureMode) {
  auto here = threads_group([](std::string&) {});
  const std::string ep = ucx_endpoint_for_test(*here[0], 1);
  EXPECT_NE(ep.find("/memory"), std::string::npos) << ep;
  EXPECT_EQ(ep.find("tcp/"), std::string::npos) << ep;

  auto elsewhere = threads_group([](std::string& a) {
    const size_t boot = a.find(' ') + 1;  // "ptpeer1 <boot id> ...": another machine's boot id
    for (size_t i = boot; i < boot + 36; ++i)
      if (a[i] != '-') a[i] = a[i] == 'a' ? 'b' : 'a';
  });
  const std::string remote = ucx_endpoint_for_test(*elsewhere[0], 1);
  EXPECT_NE(remote.find("tcp/"), std::string::npos) << remote;
  EXPECT_EQ(remote.find("/memory"), std::string::npos) << remote;
  elsewhere[1]->send(0, act(0), torch::ones({3}));
  EXPECT_EQ(elsewhere[0]->recv(1, act(0), Deadline::after(kWait)).numel(), 3);
}

// Any client of the rendezvous store can write an address: one that does not start with a
// process identity record is refused before UCX sees it, naming the rank that published it.
TEST(UcxSameHost, AnAddressWithoutAProcessIdentityIsRefusedNamingItsRank) {
  for (const std::string& bad :
       {std::string(10, 'x'), std::string(300, '\xff'), std::string(ucx::kIdentityBytes, ' ') + "address"}) {
    int peer = -1;
    const std::string err = test::transport_error_of(
        [&] {
          make_ucx_transport(0, 2, [&](const std::string& mine) { return std::vector<std::string>{mine, bad}; },
                             ucx(true));
        },
        &peer);
    EXPECT_EQ(peer, 1) << err;
    EXPECT_NE(err.find("the address that rank 1 published does not start with a process identity"),
              std::string::npos)
        << err;
  }
}

}  // namespace

#endif
