// Every transport backend compiled into this build, at world sizes 2, 3 and 4, against the same
// contract: per-(peer, tag) order, many messages in flight, large, empty and non-contiguous
// tensors, every wire dtype, deadlines, abort, and refusal of wrong or malformed messages.
// Ranks run as threads; every wait has a deadline of seconds.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include <torch/torch.h>

#include "comm/transport.h"
#include "tests/helpers.h"
#include "comm/wire.h"
#include "common/config.h"
#include "common/error.h"
#include "job/config.h"
#include "pipeline/pipeline.h"
#include "train/trainer.h"
#if PIPETRAIN_HAVE_UCX
#include "comm/ucx/testing.h"
#include "comm/ucx/transport.h"
#endif

using namespace pipetrain;
using namespace pipetrain::comm;
using pipetrain::test::Failing;

namespace {

constexpr double kWait = 20;  // seconds; far longer than any healthy wait here

MessageId act(int m, int64_t step = 0, int chunk = 0) { return {Kind::Activation, m, chunk, step}; }
MessageId grad(int m, int64_t step = 0) { return {Kind::Grad, m, 0, step}; }

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

using Group = std::vector<std::unique_ptr<Transport>>;

// Runs fn(rank) on one thread per rank and rethrows the first failure. A failing rank aborts
// its transport, so that its peers stop waiting instead of running into their deadlines.
template <typename Fn>
void run_ranks(Group& g, Fn fn) {
  const int world = static_cast<int>(g.size());
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        g[r]->abort("rank " + std::to_string(r) + " failed: " + e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// The backends whose ranks can be threads of one process: all but NCCL, which takes one GPU
// per process (its checks are the gpu tests).
std::vector<std::string> in_process_backends() {
  std::vector<std::string> v;
  for (const auto& b : transport_backends())
    if (b != "nccl") v.push_back(b);
  return v;
}

// A backend with its options: "ucx" also runs without peer-failure detection, the mode in
// which UCX may use shared memory.
std::vector<std::string> variants() {
  std::vector<std::string> v;
  for (const auto& b : in_process_backends()) {
    v.push_back(b);
    if (b == "ucx") v.push_back("ucx_no_failure_detection");
  }
  return v;
}

class TransportConformance : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  std::string variant() const { return std::get<0>(GetParam()); }
  std::string backend() const { return variant().substr(0, variant().find('_')); }
  int world() const { return std::get<1>(GetParam()); }
  Group make(uint64_t max_message_bytes = uint64_t(1) << 32) const {
    TransportOptions o;
    o.backend = pipetrain::comm::parse_backend(backend());
    o.detect_peer_failure = variant().find("no_failure_detection") == std::string::npos;
    o.max_message_bytes = max_message_bytes;
    return make_transport_group(o, world());
  }
  void SetUp() override { g = make(); }

  Group g;
};

TEST_P(TransportConformance, ReportsItsIdentity) {
  for (int r = 0; r < world(); ++r) {
    EXPECT_EQ(g[r]->rank(), r);
    EXPECT_EQ(g[r]->world_size(), world());
    EXPECT_EQ(g[r]->backend(), backend());
  }
}

// Each rank sends to every rank (itself included) 25 messages on each of 4 tags, interleaved,
// and receives the tags in the opposite order: each (peer, tag) keeps its own order.
TEST_P(TransportConformance, KeepsOrderPerPeerAndTag) {
  const int W = world();
  constexpr int kPerTag = 25, kTags = 4;
  run_ranks(g, [&](int r) {
    for (int i = 0; i < kPerTag * kTags; ++i)
      for (int dst = 0; dst < W; ++dst)
        g[r]->send(dst, act(i % kTags, 0, i % 2), torch::full({3}, 1000 * r + i));
    for (int src = W - 1; src >= 0; --src)
      for (int tag = kTags - 1; tag >= 0; --tag)
        for (int i = tag; i < kPerTag * kTags; i += kTags) {
          at::Tensor t = g[r]->recv(src, act(tag, 0, i % 2), Deadline::after(kWait));
          ASSERT_EQ(t[0].item<int64_t>(), 1000 * src + i) << "rank " << r << " from " << src;
        }
  });
}

// Hundreds of messages, small and large, all sent before the receiver asks for any.
TEST_P(TransportConformance, ManyMessagesInFlight) {
  const int W = world();
  constexpr int kCount = 300;
  for (int r = 0; r < W; ++r) {
    const int dst = (r + 1) % W;
    for (int i = 0; i < kCount; ++i) {
      const int64_t n = i % 10 == 0 ? 5000 : 4;  // every tenth beyond the inline size
      g[r]->send(dst, grad(i), torch::full({n}, r * kCount + i, torch::kLong));
    }
  }
  run_ranks(g, [&](int r) {
    const int src = (r + W - 1) % W;
    for (int i = 0; i < kCount; ++i) {
      at::Tensor t = g[r]->recv(src, grad(i), Deadline::after(kWait));
      ASSERT_EQ(t.numel(), i % 10 == 0 ? 5000 : 4);
      ASSERT_EQ(t[-1].item<int64_t>(), src * kCount + i);
    }
  });
}

TEST_P(TransportConformance, Moves64MiBTensor) {
  const int64_t n = (int64_t(64) << 20) / 4;
  at::Tensor big = torch::arange(n, torch::kInt32).view({1024, -1});
  const int last = world() - 1;
  g[0]->send(last, act(0, 3), big);
  at::Tensor got = g[last]->recv(0, act(0, 3), Deadline::after(kWait));
  EXPECT_EQ(got.sizes(), big.sizes());
  EXPECT_TRUE(torch::equal(got, big));
  // A received tensor is an ordinary tensor: in-place updates, autograd, outliving the group.
  got.add_(1);
  EXPECT_EQ(got[1023][-1].item<int>(), n);
  g.clear();
  at::Tensor x = got.to(torch::kFloat).requires_grad_();
  (x * 2).sum().backward();
  EXPECT_EQ(x.grad()[0][0].item<float>(), 2.0f);
}

TEST_P(TransportConformance, EmptyAndZeroDimTensors) {
  const std::vector<std::vector<int64_t>> shapes{{0}, {0, 5}, {3, 0, 2}, {}};
  int m = 0;
  for (const auto& shape : shapes) g[1]->send(0, act(m++), torch::ones(shape));
  m = 0;
  for (const auto& shape : shapes) {
    at::Tensor t = g[0]->recv(1, act(m++), Deadline::after(kWait));
    EXPECT_EQ(t.sizes().vec(), shape);
    EXPECT_EQ(t.numel(), shape.empty() ? 1 : 0);
  }
}

TEST_P(TransportConformance, NonContiguousTensors) {
  const at::Tensor base = torch::arange(40000, torch::kDouble).view({200, 200});
  const std::vector<at::Tensor> views{
      base.t(),                                                     // transposed, large
      base.slice(0, 0, 200, 7).slice(1, 1, 200, 3),                 // strided, large
      base.narrow(1, 5, 3),                                         // small slice
      torch::arange(4, torch::kFloat).view({4, 1}).expand({4, 6}),  // zero stride
  };
  for (size_t i = 0; i < views.size(); ++i) {
    ASSERT_FALSE(views[i].is_contiguous());
    g[0]->send(1, act(static_cast<int>(i)), views[i]);
  }
  for (size_t i = 0; i < views.size(); ++i) {
    at::Tensor t = g[1]->recv(0, act(static_cast<int>(i)), Deadline::after(kWait));
    EXPECT_TRUE(torch::equal(t, views[i])) << "view " << i;
  }
}

TEST_P(TransportConformance, EveryWireDtype) {
  const std::vector<c10::ScalarType> dtypes{torch::kFloat, torch::kDouble, torch::kHalf,  torch::kBFloat16,
                                            torch::kLong,  torch::kInt,    torch::kShort, torch::kChar,
                                            torch::kByte,  torch::kBool};
  const int last = world() - 1;
  for (size_t i = 0; i < dtypes.size(); ++i)
    for (int64_t n : {5, 20000}) {  // inline and apart
      at::Tensor t = (torch::randn({n}) * 50).to(dtypes[i]);
      g[last]->send(0, act(static_cast<int>(i)), t);
      at::Tensor got = g[0]->recv(last, act(static_cast<int>(i)), Deadline::after(kWait));
      EXPECT_EQ(got.scalar_type(), dtypes[i]);
      EXPECT_TRUE(torch::equal(got, t)) << c10::toString(dtypes[i]);
    }
}

TEST_P(TransportConformance, DeadlineFiresNamingRankAndMessage) {
  const auto t0 = Clock::now();
  int peer = -1;
  std::string err;
  try {
    g[1]->recv(0, act(3, 9), Deadline::after(0.2));
  } catch (const TimeoutError& e) {
    peer = e.peer();
    err = e.what();
  }
  const double waited = seconds_since(t0);
  EXPECT_EQ(peer, 0);
  // UCX and Gloo probe the peer before the deadline: this one is alive, so the wait goes on once more.
  EXPECT_EQ(err.rfind("rank 1: timed out waiting for activation of micro-batch 3 (step 9) from rank 0", 0), 0u) << err;
  if (backend() == "ucx" || backend() == "gloo") {
    EXPECT_NE(err.find("(it is alive but did not send it)"), std::string::npos) << err;
    EXPECT_GE(waited, 0.35);  // the deadline, then about as long again
  }
  EXPECT_GE(waited, 0.19);
  EXPECT_LT(waited, 2.0);
  // The transport still works after a timeout.
  g[0]->send(1, act(3, 9), torch::ones({2}));
  EXPECT_EQ(g[1]->recv(0, act(3, 9), Deadline::after(kWait)).numel(), 2);
}

TEST_P(TransportConformance, AbortWakesWaitersOnEveryRank) {
  const int W = world();
  std::vector<std::string> errors(W);
  const auto t0 = Clock::now();
  std::vector<std::thread> waiters;
  for (int r = 1; r < W; ++r)
    waiters.emplace_back(
        [&, r] { errors[r] = test::transport_error_of([&] { g[r]->recv(0, act(0), Deadline::after(60)); }); });
  g[0]->abort("stage 0 failed");
  for (auto& t : waiters) t.join();
  EXPECT_LT(seconds_since(t0), 10.0) << "waiters were not woken";
  for (int r = 1; r < W; ++r) {
    EXPECT_NE(errors[r].find("aborted"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("stage 0 failed"), std::string::npos) << errors[r];
  }
  // Later calls fail at once, on every rank.
  for (int r = 0; r < W; ++r) {
    EXPECT_THROW(g[r]->send((r + 1) % W, act(1), torch::ones({1})), TransportError);
    EXPECT_THROW(g[r]->recv((r + 1) % W, act(1), Deadline::after(kWait)), TransportError);
  }
}

TEST_P(TransportConformance, AbortFromAnotherThreadWakesOwnWait) {
  std::string err;
  const auto t0 = Clock::now();
  std::thread waiter([&] { err = test::transport_error_of([&] { g[1]->recv(0, grad(2), Deadline::after(60)); }); });
  g[1]->abort("watchdog");
  waiter.join();
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_NE(err.find("watchdog"), std::string::npos) << err;
}

TEST_P(TransportConformance, WrongStepIsRefused) {
  g[0]->send(1, act(0, 1), torch::ones({4}));
  int peer = -1;
  const std::string err = test::transport_error_of([&] { g[1]->recv(0, act(0, 2), Deadline::after(kWait)); }, &peer);
  EXPECT_EQ(peer, 0);
  EXPECT_NE(
      err.find("expected activation of micro-batch 0 (step 2) from rank 0, got micro-batch 0 of step 1"),
      std::string::npos)
      << err;
}

TEST_P(TransportConformance, MessageOverLimitIsRefused) {
  Group small = make(64);
  small[0]->send(1, act(0), torch::ones({100}));
  int peer = -1;
  const std::string err = test::transport_error_of([&] { small[1]->recv(0, act(0), Deadline::after(kWait)); }, &peer);
  EXPECT_EQ(peer, 0);
  EXPECT_NE(err.find("from rank 0"), std::string::npos) << err;
  EXPECT_NE(err.find("message limit of 64 bytes"), std::string::npos) << err;
}

TEST_P(TransportConformance, BadPeerIsAnError) {
  EXPECT_THROW(g[0]->send(world(), act(0), torch::ones({1})), TransportError);
  EXPECT_THROW(g[0]->recv(-1, act(0), Deadline::after(1)), TransportError);
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
  std::string name = std::get<0>(info.param);  // "nccl-order": gtest names take no '-'
  std::replace(name.begin(), name.end(), '-', '_');
  return name + "_world" + std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Backends, TransportConformance,
                         ::testing::Combine(::testing::ValuesIn(variants()), ::testing::Values(2, 3, 4)),
                         param_name);

// A backend is named once (parse_backend); an unknown name is a ConfigError that lists the
// table's names, and the factory refuses a backend this build lacks or whose ranks cannot be
// threads, saying which from the backend's row.
TEST(TransportFactory, UnknownOrMissingBackendIsAConfigError) {
  try {
    parse_backend("carrier-pigeon", "runtime.transport");
    FAIL();
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("runtime.transport: unknown transport \"carrier-pigeon\""), std::string::npos) << what;
    EXPECT_NE(what.find("local, ucx, gloo, nccl-order, nccl"), std::string::npos) << what;
  }
  for (const BackendInfo& b : backend_table()) {
    EXPECT_EQ(parse_backend(b.name), b.backend);
    EXPECT_STREQ(name(b.backend), b.name);
    EXPECT_EQ(has_transport_backend(b.name), b.compiled);
    if (b.compiled && b.threads) continue;
    TransportOptions o;
    o.backend = b.backend;
    try {
      make_transport_group(o, 2);
      ADD_FAILURE() << b.name << " made an in-process group";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(b.compiled ? "not the threads of one process" : "is not compiled into this build (needs "),
                std::string::npos) << what;
    }
  }
}

#if PIPETRAIN_HAVE_UCX
// A peer that sends garbage where a header belongs: the receiver refuses it, naming the peer,
// before it allocates anything (a 2^40-element shape would not fit in memory).
TEST(UcxHostilePeer, MalformedHeadersAreRefusedNamingThePeer) {
  Group g = make_ucx_group(3);
  WireHeader h;
  h.dtype = WireDType::Float32;
  h.dims = {2, 3};
  h.nbytes = 24;
  h.tag = act(0).tag();
  const auto good = encode(h);
  auto as_string = [](const std::array<uint8_t, kWireHeaderBytes>& b) {
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  };
  auto refused = [&](int m, const std::string& bytes) {
    send_raw_header_for_test(*g[2], 1, act(m), bytes);
    int peer = -1;
    const std::string err = test::transport_error_of([&] { g[1]->recv(2, act(m), Deadline::after(kWait)); }, &peer);
    EXPECT_EQ(peer, 2) << err;
    EXPECT_NE(err.find("from rank 2"), std::string::npos) << err;
    return err;
  };

  std::string bad_magic = as_string(good);
  bad_magic[0] ^= 0x5a;
  EXPECT_NE(refused(0, bad_magic).find("bad magic"), std::string::npos);

  WireHeader huge = h;
  huge.dims = {int64_t(1) << 40};
  huge.nbytes = uint64_t(1) << 42;
  EXPECT_NE(refused(1, as_string(encode(huge))).find("limit"), std::string::npos);

  WireHeader oversized = h;
  oversized.nbytes = uint64_t(1) << 33;  // over the 4 GiB default limit, shape says 24 bytes
  EXPECT_NE(refused(2, as_string(encode(oversized))).find("exceed the message limit"), std::string::npos);

  WireHeader mismatch = h;
  mismatch.nbytes = 28;
  EXPECT_NE(refused(3, as_string(encode(mismatch))).find("do not match"), std::string::npos);

  EXPECT_NE(refused(4, as_string(good).substr(0, 50)).find("size 50 bytes"), std::string::npos);
  EXPECT_NE(refused(5, std::string(100000, 'x')).find("larger than a header"), std::string::npos);

  // The receiver is still usable for well-formed messages.
  g[2]->send(1, act(6), torch::ones({3}));
  EXPECT_EQ(g[1]->recv(2, act(6), Deadline::after(kWait)).numel(), 3);
}

// Messages whose header waits in UCX's queue while an earlier message's data arrives are
// received ahead (comm/ucx/transport.cpp, read_ahead): the receiver still gets each in the order
// UCX keeps per tag, whatever order it asks in, with what was sent; a wrong step or a malformed
// header read ahead is refused as it would be otherwise; messages read ahead but never asked
// for go with the transport; and with read_ahead 0 nothing is read ahead.
TEST(UcxTransport, ReceivesAheadKeepingOrderAndRefusals) {
  Group g = make_ucx_group(2);
  const uint64_t before = ucx_read_ahead_for_test();
  const int64_t n = 16384;  // 64 KiB of float: data apart from its header
  auto payload = [&](int m, int64_t step) { return torch::full({n}, static_cast<float>(10 * m + step)); };
  for (int m = 0; m < 6; ++m) g[0]->send(1, act(m), payload(m, 0));
  for (int64_t step : {0, 1}) g[0]->send(1, act(7, step), payload(7, step));  // one tag, two steps
  g[0]->send(1, act(8, 1), payload(8, 1));
  send_raw_header_for_test(*g[0], 1, act(9), std::string(kWireHeaderBytes, 'x'));
  for (int m : {0, 5, 3, 4, 2, 1}) {
    const at::Tensor t = g[1]->recv(0, act(m), Deadline::after(kWait));
    ASSERT_EQ(t.numel(), n);
    EXPECT_TRUE(torch::equal(t, payload(m, 0))) << "micro-batch " << m;
  }
  for (int64_t step : {0, 1})
    EXPECT_TRUE(torch::equal(g[1]->recv(0, act(7, step), Deadline::after(kWait)), payload(7, step))) << step;
  EXPECT_GT(ucx_read_ahead_for_test(), before) << "no header was read ahead";
  int peer = -1;
  std::string err = test::transport_error_of([&] { g[1]->recv(0, act(8, 2), Deadline::after(kWait)); }, &peer);
  EXPECT_EQ(peer, 0);
  EXPECT_NE(err.find("expected activation of micro-batch 8 (step 2) from rank 0, got micro-batch 8 of step 1"),
            std::string::npos)
      << err;
  err = test::transport_error_of([&] { g[1]->recv(0, act(9), Deadline::after(kWait)); }, &peer);
  EXPECT_EQ(peer, 0);
  EXPECT_NE(err.find("bad magic"), std::string::npos) << err;
  // Still usable; then three large messages of which only the first is asked for.
  for (int m = 10; m < 13; ++m) g[0]->send(1, act(m), payload(m, 0));
  EXPECT_TRUE(torch::equal(g[1]->recv(0, act(10), Deadline::after(kWait)), payload(10, 0)));
  const auto t0 = Clock::now();
  g.clear();
  EXPECT_LT(seconds_since(t0), kWait);

  // read_ahead 0: each message is received when asked for, and none ahead.
  TransportOptions off;
  off.read_ahead = 0;
  Group plain = make_ucx_group(2, off);
  const uint64_t before_plain = ucx_read_ahead_for_test();
  for (int m = 0; m < 4; ++m) plain[0]->send(1, act(m), payload(m, 0));
  for (int m = 0; m < 4; ++m) EXPECT_TRUE(torch::equal(plain[1]->recv(0, act(m), Deadline::after(kWait)), payload(m, 0)));
  EXPECT_EQ(ucx_read_ahead_for_test(), before_plain);
}

TEST(UcxTransport, MultiProcessFactoryWithInMemoryExchange) {
  // The per-rank factory with an exchange that publishes into a shared table: what a
  // multi-process runtime does through its store, here with threads.
  constexpr int W = 3;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> table(W);
  int published = 0;
  Group g(W);
  std::vector<std::thread> threads;
  for (int r = 0; r < W; ++r)
    threads.emplace_back([&, r] {
      g[r] = make_ucx_transport(r, W, [&](const std::string& mine) {
        std::unique_lock<std::mutex> lock(mu);
        table[r] = mine;
        ++published;
        cv.notify_all();
        if (!cv.wait_for(lock, std::chrono::seconds(20), [&] { return published == W; }))
          throw TimeoutError(-1, "address exchange timed out");
        return table;
      });
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < W; ++r) ASSERT_TRUE(g[r]);
  run_ranks(g, [&](int r) {
    g[r]->send((r + 1) % W, act(0), torch::full({2}, r));
    EXPECT_EQ(g[r]->recv((r + W - 1) % W, act(0), Deadline::after(kWait))[0].item<int>(), (r + W - 1) % W);
  });
}
#endif

// The pipeline trains the same over every backend: per-step losses and final parameters are
// bit-identical to the local transport's (the tensors travel unchanged, and each stage's
// arithmetic does not depend on how its inputs arrived).
TEST(TransportPipeline, TrainingIsBitIdenticalAcrossBackends) {
  auto build = [] {
    torch::manual_seed(0);
    torch::nn::Sequential s;
    for (int i = 0; i < 4; ++i) {
      s->push_back("fc" + std::to_string(i), torch::nn::Linear(64, 64));
      s->push_back("relu" + std::to_string(i), torch::nn::Functional(torch::relu));
    }
    s->push_back("head", torch::nn::Linear(64, 10));
    return s;
  };
  torch::manual_seed(1);
  const at::Tensor x = torch::randn({48, 64});
  const at::Tensor y = torch::randint(0, 10, {48}, torch::kLong);
  auto train = [&](const std::string& backend, int stages, const std::string& schedule) {
    torch::nn::Sequential model = build();
    pipeline::PipelineOptions o;
    o.stages = stages;
    o.micro_batches = 6;
    o.schedule = schedule::parse_kind(schedule);
    o.timeout_s = 30;
    o.transport.backend = pipetrain::comm::parse_backend(backend);
    pipeline::Pipeline pipe(model, o, job::mean_cross_entropy);
    pipe.optimizers().set(
        [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 0.05); });
    std::vector<double> losses;
    for (int step = 0; step < 5; ++step) losses.push_back(pipe.train_step(x, y));
    return std::make_pair(losses, model);
  };
  for (const std::string& backend : in_process_backends()) {
    for (const auto& [stages, schedule] :
         std::vector<std::pair<int, std::string>>{{2, "gpipe"}, {3, "1f1b"}}) {
      auto [want, want_model] = train("local", stages, schedule);
      auto [got, got_model] = train(backend, stages, schedule);
      EXPECT_EQ(got, want) << backend << ", " << stages << " stages, " << schedule;
      auto pw = want_model->named_parameters(), pg = got_model->named_parameters();
      for (const auto& p : pw)
        EXPECT_TRUE(torch::equal(p.value(), pg[p.key()])) << backend << ": " << p.key();
    }
  }
}


// A stage that throws aborts its transport; over UCX the abort reaches the other ranks as a
// message. Every stage stops long before the 60 s timeout, the first failure is what the caller
// sees, and the next step runs on a fresh group.
TEST(TransportPipeline, FailingStageStopsEveryRankOnEveryBackend) {
  for (const std::string& backend : in_process_backends()) {
    torch::manual_seed(0);
    torch::nn::Sequential model;
    model->push_back("fc0", torch::nn::Linear(4, 4));
    model->push_back("fc1", torch::nn::Linear(4, 4));
    model->push_back("bad", Failing(2));  // fails on the second micro-batch
    model->push_back("fc3", torch::nn::Linear(4, 4));
    pipeline::PipelineOptions o;
    o.stages = 4;
    o.micro_batches = 4;
    o.timeout_s = 60;
    o.transport.backend = pipetrain::comm::parse_backend(backend);
    pipeline::Pipeline pipe(model, o, job::mean_cross_entropy);
    const at::Tensor x = torch::randn({8, 4});
    const at::Tensor y = torch::randint(0, 4, {8}, torch::kLong);
    const auto t0 = Clock::now();
    try {
      pipe.forward_backward(x, y);
      ADD_FAILURE() << backend << ": the injected failure was not reported";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("stage 2: forward(mb 1): injected failure"), std::string::npos)
          << backend << ": " << e.what();
    }
    EXPECT_LT(seconds_since(t0), 10.0) << backend;
    EXPECT_NO_THROW(pipe.forward_backward(x, y)) << backend;
  }
}

}  // namespace
