// The rendezvous through c10d::TCPStore, with ranks as threads on a free loopback port (rank
// identity from launcher environments: launcher_env_test).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <functional>
#include <iterator>
#include <thread>

#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/launcher_env.h"
#include "comm/rendezvous.h"
#include "common/config.h"
#include "common/error.h"
#include "common/log.h"
#include "tests/process_helpers.h"
#if PIPETRAIN_HAVE_UCX
#include <fcntl.h>
#include <ucs/config/types.h>

#include "comm/ucx/process_watch.h"
#include "comm/ucx/testing.h"
#include "comm/ucx/transport.h"
#endif

using namespace pipetrain;
using namespace pipetrain::comm;
using pipetrain::test::free_port;

namespace {

RankInfo rank_info(int rank, int world, int port) {
  RankInfo i;
  i.rank = rank;
  i.world_size = world;
  i.master_port = port;
  i.launcher = "test";
  return i;
}

// Runs fn(rank) for the given ranks on threads; returns each rank's exception (or null).
std::vector<std::exception_ptr> run(const std::vector<int>& ranks, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        fn(ranks[i]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

template <typename E>
std::string what_of(const std::exception_ptr& e, int* peer = nullptr) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const E& x) {
    if constexpr (std::is_base_of_v<TransportError, E>) {
      if (peer) *peer = x.peer();
    }
    return x.what();
  } catch (...) {
    return "an exception of another type";
  }
}

TEST(Rendezvous, EveryRankGetsEveryAddress) {
  constexpr int W = 4;
  const int port = free_port();
  std::vector<std::vector<std::string>> got(W);
  auto errors = run({0, 1, 2, 3}, [&](int r) {
    got[r] = rendezvous(rank_info(r, W, port), "address of " + std::to_string(r), config_fingerprint("same"),
                        Deadline::after(30));
  });
  for (int r = 0; r < W; ++r) {
    ASSERT_FALSE(errors[r]) << what_of<std::exception>(errors[r]);
    EXPECT_EQ(got[r],
              (std::vector<std::string>{"address of 0", "address of 1", "address of 2", "address of 3"}));
  }
}

TEST(Rendezvous, BinaryAddressesSurvive) {
  const int port = free_port();
  std::string binary("\0\x01\xff\x7f", 4);
  std::vector<std::vector<std::string>> got(2);
  auto errors = run({0, 1}, [&](int r) {
    got[r] = rendezvous(rank_info(r, 2, port), binary + char('a' + r), "h", Deadline::after(30));
  });
  ASSERT_FALSE(errors[0] || errors[1]);
  EXPECT_EQ(got[1][0], binary + 'a');
  EXPECT_EQ(got[0][1], binary + 'b');
}

TEST(Rendezvous, DifferentConfigNamesTheRank) {
  constexpr int W = 3;
  const int port = free_port();
  auto errors = run({0, 1, 2}, [&](int r) {
    rendezvous(rank_info(r, W, port), "a", config_fingerprint(r == 2 ? "lr=0.2" : "lr=0.1"),
               Deadline::after(30));
  });
  for (int r = 0; r < W; ++r) {
    const std::string msg = what_of<ConfigError>(errors[r]);
    EXPECT_NE(msg.find("the configuration of rank 2 differs from rank 0's"), std::string::npos)
        << "rank " << r << ": " << msg;
  }
}

TEST(Rendezvous, MissingRankTimesOutNamingIt) {
  constexpr int W = 3;
  const int port = free_port();
  const auto t0 = Clock::now();
  auto errors = run({0, 1}, [&](int r) {  // rank 2 never comes
    rendezvous(rank_info(r, W, port), "a", "h", Deadline::after(1.5));
  });
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(took, 6.0);
  for (int r = 0; r < 2; ++r) {
    int peer = -1;
    const std::string msg = what_of<TimeoutError>(errors[r], &peer);
    EXPECT_EQ(peer, 2) << msg;
    EXPECT_NE(msg.find("rank 2 did not join"), std::string::npos) << msg;
  }
}

TEST(Rendezvous, MissingRankZeroTimesOutNamingIt) {
  const int port = free_port();
  const auto t0 = Clock::now();
  auto errors = run({1}, [&](int r) { rendezvous(rank_info(r, 2, port), "a", "h", Deadline::after(1.5)); });
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 6.0);
  int peer = -1;
  const std::string msg = what_of<TimeoutError>(errors[0], &peer);
  EXPECT_EQ(peer, 0) << msg;
  EXPECT_NE(msg.find("cannot reach rank 0's rendezvous store"), std::string::npos) << msg;
}

// Whether a TCP connection to host:port is accepted now.
bool connects(const char* host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host, &a.sin_addr);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// Rank 0's store listens on MASTER_ADDR only: 127.0.0.1 reaches it, 127.0.0.2 (the same host,
// another address) does not.
TEST(Rendezvous, StoreListensOnTheMasterAddressOnly) {
  const int port = free_port();
  std::thread rank0([&] {
    try {
      rendezvous(rank_info(0, 2, port), "a", "h", Deadline::after(3));  // rank 1 never comes
    } catch (const TimeoutError&) {
    }
  });
  const auto t0 = Clock::now();
  bool up = false;
  while (!up && Clock::now() - t0 < std::chrono::seconds(3)) {  // the store starts serving
    up = connects("127.0.0.1", port);
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const bool elsewhere = connects("127.0.0.2", port);
  rank0.join();
  ASSERT_TRUE(up) << "the store never listened on 127.0.0.1:" << port;
  EXPECT_FALSE(elsewhere) << "the store also accepts connections on 127.0.0.2";
}

TEST(Rendezvous, FingerprintIsStableAndSensitive) {
  EXPECT_EQ(config_fingerprint("abc"), config_fingerprint("abc"));
  EXPECT_NE(config_fingerprint("abc"), config_fingerprint("abd"));
  EXPECT_EQ(config_fingerprint("").size(), 16u);
}

#if PIPETRAIN_HAVE_UCX
// The store as the address exchange of the UCX transport: what a multi-process runtime does,
// here with threads.
TEST(Rendezvous, ConnectsUcxTransports) {
  constexpr int W = 3;
  const int port = free_port();
  std::vector<std::unique_ptr<Transport>> g(W);
  auto errors = run({0, 1, 2}, [&](int r) {
    TransportOptions o;
    o.backend = pipetrain::comm::Backend::Ucx;
    g[r] = make_ucx_transport(r, W, store_exchange(rank_info(r, W, port), "h", Deadline::after(30)), o);
    const MessageId id{Kind::Activation, 0};
    g[r]->send((r + 1) % W, id, torch::full({3}, r));
    EXPECT_EQ(g[r]->recv((r + W - 1) % W, id, Deadline::after(30))[0].item<int>(), (r + W - 1) % W);
  });
  for (int r = 0; r < W; ++r) EXPECT_FALSE(errors[r]) << what_of<std::exception>(errors[r]);
}

// Any client of the store can overwrite a rank's address: random bytes there reached UCX, which
// aborted the process (ucp_address_unpack). The record is checked first; the error names the key.
TEST(Rendezvous, PoisonedAddressIsRefusedNamingTheKey) {
  const int port = free_port();
  std::exception_ptr error;
  std::thread rank0([&] {
    try {
      TransportOptions o;
      o.backend = pipetrain::comm::Backend::Ucx;
      make_ucx_transport(0, 2, store_exchange(rank_info(0, 2, port), "h", Deadline::after(20)), o);
    } catch (...) {
      error = std::current_exception();
    }
  });
  // The attacker, posing as rank 1: the right configuration hash, random bytes as the address.
  const auto t0 = Clock::now();
  while (!connects("127.0.0.1", port) && Clock::now() - t0 < std::chrono::seconds(10))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = false;
  so.waitWorkers = false;
  so.timeout = std::chrono::seconds(10);
  c10d::TCPStore attacker("127.0.0.1", so);
  std::vector<uint8_t> garbage(300);
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<uint8_t>(i * 131 + 7);
  attacker.set("pipetrain/address/1", garbage);
  attacker.set("pipetrain/config/1", std::vector<uint8_t>{'h'});
  rank0.join();
  int peer = -1;
  const std::string msg = what_of<TransportError>(error, &peer);
  EXPECT_EQ(peer, 1) << msg;
  EXPECT_NE(msg.find("the store's entry pipetrain/address/1 is not a valid address record (no record magic)"),
            std::string::npos)
      << msg;
}
#endif

#if PIPETRAIN_HAVE_UCX
// The TCP listening addresses of this process's sockets (from /proc/net/tcp, matched by inode).
std::vector<std::string> listening_addresses() {
  std::set<std::string> inodes;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::vector<std::string> out;
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  std::getline(tcp, line);  // header
  while (std::getline(tcp, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
    f >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
    if (state != "0A" || !inodes.count(inode)) continue;  // 0A: LISTEN
    const uint32_t ip = static_cast<uint32_t>(std::stoul(local.substr(0, 8), nullptr, 16));
    char text[INET_ADDRSTRLEN];
    in_addr a{};
    a.s_addr = ip;  // /proc/net/tcp prints the address as the host-order value of the network bytes
    ::inet_ntop(AF_INET, &a, text, sizeof text);
    out.push_back(text);
  }
  return out;
}

// The first IPv4 address of an interface other than loopback, or "" when there is none.
std::string other_address() {
  ifaddrs* ifs = nullptr;
  std::string found;
  if (::getifaddrs(&ifs) != 0) return found;
  for (ifaddrs* i = ifs; i && found.empty(); i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && !(i->ifa_flags & IFF_LOOPBACK)) {
      char text[INET_ADDRSTRLEN];
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
      found = text;
    }
  ::freeifaddrs(ifs);
  return found;
}

// UCX's TCP transport listened on every interface of the host; a rank now passes the devices by
// which it reaches MASTER_ADDR, and UCX listens there only.
TEST(Rendezvous, UcxListensOnTheInterfaceTowardsTheMasterOnly) {
  EXPECT_EQ(ucx_devices_towards("127.0.0.1").substr(0, 2), "lo");
  EXPECT_EQ(ucx_devices_towards("no-such-host.invalid"), "");
  const std::string other = other_address();
  if (other.empty()) GTEST_SKIP() << "this host has no interface but loopback, so listening everywhere cannot be told apart";
  EXPECT_NE(ucx_devices_towards(other).substr(0, 2), "lo") << "the route to " << other;
  if (std::getenv("UCX_NET_DEVICES")) GTEST_SKIP() << "UCX_NET_DEVICES is set and wins";
  auto listened = [](const std::string& devices) {
    TransportOptions o;
    o.backend = pipetrain::comm::Backend::Ucx;
    o.net_devices = devices;
    auto group = make_ucx_group(2, o);
    return listening_addresses();
  };
  const std::vector<std::string> everywhere = listened("");
  EXPECT_NE(std::find(everywhere.begin(), everywhere.end(), other), everywhere.end())
      << "without a choice UCX listens on " << other << " too";
  const std::vector<std::string> towards_lo = listened(ucx_devices_towards("127.0.0.1"));
  EXPECT_FALSE(towards_lo.empty());
  for (const auto& a : towards_lo) EXPECT_EQ(a, "127.0.0.1");
}
#endif

// Records: what the writer wrote comes back; anything else is refused with the reason.
TEST(Rendezvous, AddressRecordsAreChecked) {
  const std::string address("\0\x01\xffworker", 9);
  const std::string record = encode_address_record(3, address);
  EXPECT_EQ(decode_address_record(record, 3), address);
  auto refusal = [](const std::string& rec, int rank) {
    try {
      decode_address_record(rec, rank);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refusal(record, 2).find("written for rank 3"), std::string::npos);
  EXPECT_NE(refusal(record.substr(0, 10), 3).find("shorter than a record"), std::string::npos);
  EXPECT_NE(refusal(record.substr(0, record.size() - 1), 3).find("8 address bytes where the record says 9"),
            std::string::npos);
  std::string flipped = record;
  flipped.back() ^= 1;
  EXPECT_NE(refusal(flipped, 3).find("checksum"), std::string::npos);
  std::string huge = record;
  huge[8] = huge[9] = huge[10] = '\xff';
  EXPECT_NE(refusal(huge, 3).find("an address of"), std::string::npos);
  EXPECT_NE(refusal("PTR", 3).find("shorter"), std::string::npos);
}

// A client that sends one byte and holds the connection, or announces a 256 MiB value and sends
// nothing more, held the store's server (and the ranks' follow-up check of who is missing)
// past every deadline. The ranks must still fail by their deadline, naming the missing rank.
TEST(Rendezvous, StalledStoreClientsDoNotHoldTheRanksPastTheirDeadline) {
  for (const std::string& stall : {std::string("\x01"), std::string("\x02\x00\x00\x00\x10\x00\x00\x00", 8)}) {
    SCOPED_TRACE(stall.size());
    const int port = free_port();
    const auto t0 = Clock::now();
    std::thread attacker([&] {
      while (!connects("127.0.0.1", port) && Clock::now() - t0 < std::chrono::seconds(5))
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
        (void)!::write(fd, stall.data(), stall.size());
        std::this_thread::sleep_for(std::chrono::seconds(5));  // holds it well past the ranks' deadline
      }
      ::close(fd);
    });
    auto errors = run({0, 1}, [&](int r) {  // rank 2 never comes
      rendezvous(rank_info(r, 3, port), "a", "h", Deadline::after(2));
    });
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    attacker.join();
    EXPECT_LT(took, 5.5);
    for (int r = 0; r < 2; ++r) {
      int peer = -1;
      const std::string msg = what_of<TimeoutError>(errors[r], &peer);
      EXPECT_EQ(peer, 2) << msg;
    }
  }
}

#if PIPETRAIN_HAVE_UCX
// What this process and the children it starts (which share its stdout and stderr) write on
// either while `fn` runs.
std::string output_of(const std::function<void()>& fn) {
  std::fflush(stdout);
  std::fflush(stderr);
  const std::string path = ::testing::TempDir() + "/pipetrain_output_" + std::to_string(::getpid());
  const int file = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  const int out = ::dup(STDOUT_FILENO), err = ::dup(STDERR_FILENO);
  if (file < 0 || out < 0 || err < 0) ADD_FAILURE() << "cannot capture stdout and stderr";
  ::dup2(file, STDOUT_FILENO);
  ::dup2(file, STDERR_FILENO);
  std::exception_ptr failure;
  try {
    fn();
  } catch (...) {
    failure = std::current_exception();
  }
  std::fflush(stdout);
  std::fflush(stderr);
  ::dup2(out, STDOUT_FILENO);
  ::dup2(err, STDERR_FILENO);
  for (int fd : {file, out, err}) ::close(fd);
  if (failure) std::rethrow_exception(failure);
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// UCX's messages are lines of ours at the matching level: a warning as a warning; an error,
// which UCX also returns as a status that we report ourselves, only at --log-level debug. None
// is printed in UCX's own format (" UCX  WARN ").
TEST(Rendezvous, UcxMessagesAreOurLinesAtTheirLevel) {
  const auto group = make_ucx_group(1);  // the first UCX context routes UCX's log through ours
  const log::Level before = log::level();
  log::set_level(log::Level::Info);
  const std::string info = output_of([] {
    ucx_log_for_test(UCS_LOG_LEVEL_WARN, "a warning from UCX");
    ucx_log_for_test(UCS_LOG_LEVEL_ERROR, "an error UCX returns as a status");
  });
  log::set_level(log::Level::Debug);
  const std::string debug = output_of([] { ucx_log_for_test(UCS_LOG_LEVEL_ERROR, "an error UCX returns as a status"); });
  log::set_level(before);
  EXPECT_EQ(info.rfind("pipetrain: warning: ucx: a warning from UCX (log.cpp:", 0), 0u) << info;
  EXPECT_EQ(std::count(info.begin(), info.end(), '\n'), 1) << info;
  EXPECT_EQ(debug.rfind("pipetrain: debug: ucx: an error UCX returns as a status (log.cpp:", 0), 0u) << debug;
  EXPECT_EQ(std::count(debug.begin(), debug.end(), '\n'), 1) << debug;
}

// A well-formed record around a forged worker address (any client of the store can write one;
// the process identity before it is this process's, comm/ucx/process_watch.h):
// UCX would abort this process unpacking it; a child process unpacks it first, and the rank is
// refused with an error naming the rank that published it.
TEST(Rendezvous, AForgedUcxAddressIsRefusedNamingItsRank) {
  TransportOptions o;
  o.backend = pipetrain::comm::Backend::Ucx;
  std::string random(200, '\0');
  for (size_t i = 0; i < random.size(); ++i) random[i] = static_cast<char>((i * 2654435761u) >> 13);
  const std::vector<std::string> forged{std::string(64, '\x7f'), std::string(300, '\xff'), random};
  for (const std::string& bad : forged) {
    int peer = -1;
    std::string msg;
    // UCX's own line about the endpoint it could not make ("select.c:721 UCX ERROR no active
    // messages transport to <no debug data>") is not printed beside ours.
    const std::string printed = output_of([&] {
      try {
        make_ucx_transport(
            0, 2,
            [&](const std::string& mine) {  // this process's identity record, then the forged address
              return std::vector<std::string>{mine, mine.substr(0, ucx::kIdentityBytes) + bad};
            },
            o);
      } catch (const TransportError& e) {
        peer = e.peer();
        msg = e.what();
      }
    });
    EXPECT_EQ(printed.find(" UCX "), std::string::npos) << printed;
    EXPECT_EQ(peer, 1) << msg;
    EXPECT_NE(msg.find("the UCX worker address that rank 1 published is not one UCX can use"), std::string::npos)
        << msg;
  }
}
#endif

// Something accepts connections on the port and never answers (rank 0 stopped during the
// rendezvous, a stale or foreign program): a rank's wait ends at its deadline, naming what it
// waited for, instead of blocking in the store client for ever.
TEST(Rendezvous, ASilentListenerIsNamedAtTheDeadline) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 16), 0);  // the kernel completes connections; nobody reads them
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  const auto t0 = Clock::now();
  auto errors = run({1}, [&](int r) { rendezvous(rank_info(r, 2, port), "a", "h", Deadline::after(1.5)); });
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  ::close(fd);
  EXPECT_LT(took, 4.0);
  int peer = -1;
  const std::string msg = what_of<TimeoutError>(errors[0], &peer);
  EXPECT_EQ(peer, 0) << msg;
  EXPECT_NE(msg.find("accepts connections at 127.0.0.1:" + std::to_string(port) + " but does not answer"),
            std::string::npos)
      << msg;
}

// Two jobs on one port: a rank of the second job (another run token) is refused by name at
// once, and the first job completes unharmed. A rank started twice within one job is refused,
// naming the process that holds the slot.
TEST(Rendezvous, AnotherJobOrASecondClaimantIsRefusedByName) {
  const int port = free_port();
  auto job = [&](int r, const std::string& token, int world) {
    RankInfo i = rank_info(r, world, port);
    i.run_token = token;
    return i;
  };
  std::vector<std::vector<std::string>> got(3);
  std::exception_ptr intruder, twice;
  std::thread rank0([&] {
    try {
      got[0] = rendezvous(job(0, "job A", 3), "a0", "h", Deadline::after(30));
    } catch (...) {
      got[0] = {"failed"};
    }
  });
  std::thread rank1([&] {
    try {
      got[1] = rendezvous(job(1, "job A", 3), "a1", "h", Deadline::after(30));
    } catch (...) {
      got[1] = {"failed"};
    }
  });
  const auto t0 = Clock::now();
  intruder = run({1}, [&](int r) { rendezvous(job(r, "job B", 3), "b1", "h", Deadline::after(30)); })[0];
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
  const std::string refused = what_of<ConfigError>(intruder);
  EXPECT_NE(refused.find("serves another job (run token \"job A\", this rank's \"job B\")"), std::string::npos)
      << refused;
  // Once the first rank 1 holds its slot (seen through a client of the store), a second rank 1
  // of the same job is refused.
  c10d::TCPStoreOptions client;
  client.port = static_cast<uint16_t>(port);
  client.isServer = false;
  client.timeout = std::chrono::seconds(10);
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", client);
  for (int i = 0; i < 1000 && !store->check({"pipetrain/claim/1"}); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling the store, bounded
  twice = run({1}, [&](int r) { rendezvous(job(r, "job A", 3), "a1 again", "h", Deadline::after(30)); })[0];
  const std::string again = what_of<ConfigError>(twice);
  EXPECT_NE(again.find("another process ("), std::string::npos) << again;
  EXPECT_NE(again.find("already joined the rendezvous at 127.0.0.1:" + std::to_string(port) + " as rank 1"),
            std::string::npos)
      << again;
  got[2] = rendezvous(job(2, "job A", 3), "a2", "h", Deadline::after(30));
  rank0.join();
  rank1.join();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(got[r], (std::vector<std::string>{"a0", "a1", "a2"})) << "rank " << r;
}

}  // namespace
