#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <thread>

#include <torch/torch.h>

#include "comm/c10d/nccl_order.h"
#include "comm/local/transport.h"
#include "comm/process_group.h"
#include "comm/transport.h"
#include "comm/wire.h"
#include "common/broken_pipe.h"
#include "common/error.h"

using namespace pipetrain;
using namespace pipetrain::comm;

namespace {
WireHeader sample_header() {
  WireHeader h;
  h.dtype = WireDType::Float32;
  h.dims = {2, 3};
  h.nbytes = 24;
  h.micro_batch = 5;
  h.step = 7;
  h.tag = 42;
  return h;
}

std::string decode_error(std::array<uint8_t, kWireHeaderBytes> bytes, uint64_t max = 1 << 20) {
  try {
    decode(bytes.data(), bytes.size(), max, 3);
  } catch (const TransportError& e) {
    EXPECT_EQ(e.peer(), 3);
    return e.what();
  }
  return "";
}

void put64(std::array<uint8_t, kWireHeaderBytes>& b, size_t off, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[off + i] = static_cast<uint8_t>(v >> (8 * i));
}
constexpr size_t kDims = 8, kBytes = 8 + 8 * kWireMaxDims;
}  // namespace

TEST(Wire, RoundTrip) {
  auto h = decode(encode(sample_header()).data(), kWireHeaderBytes, 1 << 20, 1);
  EXPECT_EQ(h.dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h.nbytes, 24u);
  EXPECT_EQ(h.micro_batch, 5);
  EXPECT_EQ(h.step, 7);
  EXPECT_EQ(h.tag, 42u);
}

TEST(Wire, RefusesMalformedHeaders) {
  const auto good = encode(sample_header());
  auto b = good;
  b[0] ^= 0xff;
  EXPECT_NE(decode_error(b).find("bad magic"), std::string::npos);
  b = good;
  b[4] = 9;
  EXPECT_NE(decode_error(b).find("version"), std::string::npos);
  b = good;
  b[6] = 77;
  EXPECT_NE(decode_error(b).find("unknown dtype"), std::string::npos);
  b = good;
  b[7] = 9;
  EXPECT_NE(decode_error(b).find("dims"), std::string::npos);
  b = good;
  put64(b, kDims, static_cast<uint64_t>(-4));
  EXPECT_NE(decode_error(b).find("negative dim"), std::string::npos);
  b = good;
  put64(b, kBytes, 25);
  EXPECT_NE(decode_error(b).find("do not match"), std::string::npos);
  EXPECT_NE(decode_error(good, 16).find("limit"), std::string::npos);
  EXPECT_NE(decode_error(b).find("from rank 3"), std::string::npos);
  EXPECT_THROW(decode(good.data(), kWireHeaderBytes - 1, 1 << 20, 3), TransportError);
}

TEST(Wire, HugeShapeCannotOverflowTheCheck) {
  auto h = sample_header();
  h.dims = {int64_t(1) << 40, int64_t(1) << 40, 16};
  h.nbytes = 0;  // the product wraps to 0 in 64 bits; the receiver must still refuse it
  std::string err;
  try {
    decode(encode(h).data(), kWireHeaderBytes, uint64_t(1) << 62, 1);
  } catch (const TransportError& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("limit"), std::string::npos) << err;
}

class LocalTransportTest : public ::testing::Test {
 protected:
  std::vector<std::unique_ptr<Transport>> g = make_local_group(3);
  static MessageId act(int m, int64_t step = 0) { return {Kind::Activation, m, 0, step}; }
};

TEST_F(LocalTransportTest, DeliversInOrderPerTagAndAcrossTags) {
  for (int i = 0; i < 100; ++i) g[0]->send(1, act(i % 4), torch::full({2}, i));
  // Receive the tags in a different order than they were sent; each tag keeps its own order.
  for (int tag = 3; tag >= 0; --tag)
    for (int i = tag; i < 100; i += 4)
      EXPECT_EQ(g[1]->recv(0, act(tag), Deadline::after(5)).index({0}).item<int>(), i);
}

TEST_F(LocalTransportTest, KeepsDtypeShapeAndStrides) {
  auto base = torch::arange(12, torch::kLong).view({3, 4});
  auto t = base.t();  // non-contiguous
  g[0]->send(2, act(0), t);
  auto got = g[2]->recv(0, act(0), Deadline::after(5));
  EXPECT_TRUE(torch::equal(got, t));
  g[0]->send(2, act(1), torch::empty({0, 5}));
  EXPECT_EQ(g[2]->recv(0, act(1), Deadline::after(5)).sizes(), (std::vector<int64_t>{0, 5}));
  for (auto dt : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16, torch::kInt, torch::kShort,
                  torch::kChar, torch::kByte, torch::kBool}) {
    g[1]->send(0, act(2), torch::ones({3}, dt));
    EXPECT_EQ(g[0]->recv(1, act(2), Deadline::after(5)).scalar_type(), dt);
  }
}

TEST_F(LocalTransportTest, DeadlineFiresWithRankAndMessage) {
  try {
    g[1]->recv(0, act(3, 9), Deadline::after(0.05));
    FAIL();
  } catch (const TimeoutError& e) {
    EXPECT_EQ(e.peer(), 0);
    EXPECT_STREQ(e.what(), "rank 1: timed out waiting for activation of micro-batch 3 (step 9) from rank 0");
  }
}

TEST_F(LocalTransportTest, WrongStepIsRefused) {
  g[0]->send(1, act(0, 1), torch::ones({1}));
  try {
    g[1]->recv(0, act(0, 2), Deadline::after(5));
    FAIL();
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("got micro-batch 0 of step 1"), std::string::npos) << e.what();
  }
}

TEST_F(LocalTransportTest, MessageOverLimitIsRefused) {
  TransportOptions limited;
  limited.max_message_bytes = 64;
  auto small = make_local_group(2, limited);
  small[0]->send(1, act(0), torch::ones({100}));
  try {
    small[1]->recv(0, act(0), Deadline::after(5));
    FAIL();
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("message limit of 64 bytes"), std::string::npos) << e.what();
  }
}

TEST_F(LocalTransportTest, AbortWakesWaitersAndFailsLaterCalls) {
  std::string err;
  std::thread waiter([&] {
    try {
      g[2]->recv(1, act(0), Deadline::after(60));
    } catch (const TransportError& e) {
      err = e.what();
    }
  });
  g[0]->abort("stage 0 failed");
  waiter.join();
  EXPECT_NE(err.find("aborted"), std::string::npos) << err;
  EXPECT_NE(err.find("stage 0 failed"), std::string::npos) << err;
  EXPECT_THROW(g[1]->send(2, act(0), torch::ones({1})), TransportError);
}

TEST_F(LocalTransportTest, BadPeerIsAnError) {
  EXPECT_THROW(g[0]->send(3, act(0), torch::ones({1})), TransportError);
  EXPECT_THROW(g[0]->recv(-1, act(0), Deadline::after(1)), TransportError);
}

TEST_F(LocalTransportTest, ManyMessagesInFlightBetweenThreads) {
  constexpr int kCount = 500;
  std::thread producer([&] {
    for (int i = 0; i < kCount; ++i) g[0]->send(1, act(i), torch::full({8}, i));
  });
  int64_t sum = 0;
  for (int i = 0; i < kCount; ++i) sum += g[1]->recv(0, act(i), Deadline::after(10))[0].item<int64_t>();
  producer.join();
  EXPECT_EQ(sum, int64_t(kCount) * (kCount - 1) / 2);
}

// A write to a peer that has gone is EPIPE, not SIGPIPE's death, once a transport exists: Gloo
// writes with writev(), which cannot hold the signal back. Each case runs in a child of its own
// (the disposition is the process's); the child writes into a socketpair whose other end it
// closed, as a rank writes to a pair a failed peer left.
namespace {
enum class Before { Default, OwnHandler };
extern "C" void count_sigpipe(int) {}

// The child's exit status: 0 = the write failed with EPIPE and the disposition is as expected.
int broken_pipe_child(const std::string& backend, Before before) {
  ::alarm(60);
  if (before == Before::OwnHandler) ::signal(SIGPIPE, count_sigpipe);
  else ::signal(SIGPIPE, SIG_DFL);
  TransportOptions o;
  o.backend = pipetrain::comm::parse_backend(backend);
  auto group = make_transport_group(o, 2);
  struct sigaction now {};
  ::sigaction(SIGPIPE, nullptr, &now);
  if (before == Before::OwnHandler && now.sa_handler != count_sigpipe) return 2;
  if (before == Before::Default && now.sa_handler != SIG_IGN) return 3;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 4;
  ::close(fds[1]);
  const char byte = 1;
  const ssize_t n = ::write(fds[0], &byte, 1);  // without the fix, SIGPIPE ends the child here
  return n == -1 && errno == EPIPE ? 0 : 5;
}
}  // namespace

TEST(BrokenPipe, AWriteToAGonePeerIsAnErrorOnceATransportExists) {
  for (const auto& backend : transport_backends()) {
    if (backend != "gloo" && backend != "ucx") continue;  // the socket backends here
    for (Before before : {Before::Default, Before::OwnHandler}) {
      const pid_t child = ::fork();
      ASSERT_GE(child, 0);
      if (child == 0) {
        int code = 6;
        try {
          code = broken_pipe_child(backend, before);
        } catch (...) {
        }
        ::_exit(code);
      }
      int status = 0;
      ASSERT_EQ(::waitpid(child, &status, 0), child);
      const std::string what = backend + (before == Before::Default ? "" : " (own handler)");
      ASSERT_FALSE(WIFSIGNALED(status)) << what << ": killed by signal " << WTERMSIG(status);
      EXPECT_EQ(WEXITSTATUS(status), 0) << what;
    }
  }
}

// The "nccl-order" group (comm/c10d/nccl_order.h) keeps NCCL's rules for two ranks' operations:
// each rank's run in the order posted, tags ignored, and a send completes with the peer's receive.
TEST(NcclOrderGroup, HeadsMatchInPostingOrderWhateverTheTags) {
  auto g = make_nccl_order_group(2);
  at::Tensor a = torch::arange(4, torch::kFloat), b = torch::arange(6, torch::kFloat) + 10;
  at::Tensor ra = torch::zeros(4), rb = torch::zeros(6);
  auto s1 = send(*g[0], a, 1, /*tag=*/7);
  auto s2 = send(*g[0], b, 1, /*tag=*/3);
  EXPECT_FALSE(s1->isCompleted());  // no receive yet: the send waits for it
  auto r1 = recv(*g[1], ra, 0, /*tag=*/3);  // the tag is not what matches: the order is
  auto r2 = recv(*g[1], rb, 0, /*tag=*/7);
  for (auto* w : {&s1, &s2, &r1, &r2}) wait_work(*w, Deadline::after(5));
  EXPECT_TRUE(torch::equal(ra, a));
  EXPECT_TRUE(torch::equal(rb, b));
}

// Two sends at the heads of one pair never progress on NCCL (each blocks its stream until the
// other side receives): here both fail at once, naming the pair and both heads, and so does every
// later operation of that pair.
TEST(NcclOrderGroup, SendsCrossingOnOneStreamDeadlockNamingThePairAndBothHeads) {
  auto g = make_nccl_order_group(3);
  at::Tensor x = torch::ones(8), y = torch::ones(2), rx = torch::zeros(8), ry = torch::zeros(2);
  auto s0 = send(*g[1], x, 2, 0);
  auto r0 = recv(*g[1], ry, 2, 0);  // behind rank 1's send on the stream of pair (1, 2)
  auto s1 = send(*g[2], y, 1, 0);  // rank 2 sends first too
  for (auto* w : {&s0, &r0, &s1}) {
    try {
      wait_work(*w, Deadline::after(5));
      ADD_FAILURE() << "a deadlocked operation completed";
    } catch (const TransportError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("ranks 1 and 2 deadlock on the stream they share"), std::string::npos) << what;
      EXPECT_NE(what.find("rank 1's next operation is a send of 32 bytes to rank 2, rank 2's is a send of 8 bytes to rank 1"),
                std::string::npos)
          << what;
    }
  }
  auto later = recv(*g[2], rx, 1, 0);
  EXPECT_THROW(wait_work(later, Deadline::after(5)), TransportError);
  // Another pair is not affected.
  at::Tensor z = torch::full({3}, 5.0), rz = torch::zeros(3);
  auto s2 = send(*g[0], z, 1, 0);
  auto r2 = recv(*g[1], rz, 0, 0);
  wait_work(s2, Deadline::after(5));
  wait_work(r2, Deadline::after(5));
  EXPECT_TRUE(torch::equal(rz, z));
}

// One group per direction, as the c10d transport makes them: the same crossing sends complete
// once each side's receive is posted, whatever the order the two ranks posted in.
TEST(NcclOrderGroup, OneGroupPerDirectionNeverCrosses) {
  auto up = make_nccl_order_group(2), down = make_nccl_order_group(2);
  at::Tensor x = torch::ones(8), y = torch::full({2}, 3.0), rx = torch::zeros(8), ry = torch::zeros(2);
  auto s0 = send(*up[0], x, 1, 0);
  auto s1 = send(*down[1], y, 0, 0);
  auto r1 = recv(*up[1], rx, 0, 0);
  auto r0 = recv(*down[0], ry, 1, 0);
  for (auto* w : {&s0, &s1, &r0, &r1}) wait_work(*w, Deadline::after(5));
  EXPECT_TRUE(torch::equal(rx, x));
  EXPECT_TRUE(torch::equal(ry, y));
}

// A receive whose sender never comes ends at its deadline; aborting the group (as aborting an
// NCCL communicator) fails what is pending on it at once.
TEST(NcclOrderGroup, WaitsEndAtTheDeadlineOrTheAbort) {
  auto g = make_nccl_order_group(2);
  at::Tensor r = torch::zeros(4);
  auto pending = recv(*g[0], r, 1, 0);
  EXPECT_THROW(wait_work(pending, Deadline::after(0.05)), TimeoutError);
  g[0]->abort();
  try {
    wait_work(pending, Deadline::after(5));
    ADD_FAILURE() << "an aborted receive completed";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 aborted its group"), std::string::npos) << e.what();
  }
}
