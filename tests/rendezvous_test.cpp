// Rank identity from launcher environments (pure functions of an environment map) and the
// rendezvous through c10d::TCPStore, with ranks as threads on a free loopback port.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <functional>
#include <thread>

#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/launcher_env.h"
#include "comm/rendezvous.h"
#include "common/config.h"
#include "common/error.h"
#include "tests/process_helpers.h"
#if PIPETRAIN_HAVE_UCX
#include "comm/ucx/transport.h"
#endif

using namespace pipetrain;
using namespace pipetrain::comm;
using pipetrain::test::free_port;

namespace {

std::string config_error(const Environment& env) {
  try {
    rank_from_env(env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(LauncherEnv, NoLauncherIsOneProcess) {
  const RankInfo i = rank_from_env({});
  EXPECT_EQ(i.launcher, "none");
  EXPECT_EQ(i.rank, 0);
  EXPECT_EQ(i.world_size, 1);
  EXPECT_EQ(i.local_rank, 0);
  EXPECT_EQ(i.master_addr, "127.0.0.1");
  EXPECT_EQ(i.master_port, 29500);
}

TEST(LauncherEnv, Torchrun) {
  const RankInfo i = rank_from_env({{"RANK", "2"},
                                    {"WORLD_SIZE", "4"},
                                    {"LOCAL_RANK", "0"},
                                    {"MASTER_ADDR", "n1"},
                                    {"MASTER_PORT", "1234"}});
  EXPECT_EQ(i.launcher, "torchrun");
  EXPECT_EQ(i.rank, 2);
  EXPECT_EQ(i.world_size, 4);
  EXPECT_EQ(i.local_rank, 0);
  EXPECT_EQ(i.local_world_size, 0);  // not given
  EXPECT_EQ(i.master_addr, "n1");
  EXPECT_EQ(i.master_port, 1234);
  EXPECT_EQ(rank_from_env({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "n1"}, {"LOCAL_WORLD_SIZE", "2"}})
                .local_world_size,
            2);
  EXPECT_NE(config_error({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "n1"}, {"LOCAL_WORLD_SIZE", "5"}})
                .find("LOCAL_WORLD_SIZE=5 is outside [1, 4]"),
            std::string::npos);
  // LOCAL_RANK is optional; a single process needs no master address.
  EXPECT_EQ(rank_from_env({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).master_addr, "127.0.0.1");
}

TEST(LauncherEnv, TorchrunErrorsNameTheVariable) {
  EXPECT_NE(config_error({{"RANK", "1"}}).find("WORLD_SIZE is not set but RANK is"), std::string::npos);
  EXPECT_NE(config_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}})
                .find("RANK=4 but WORLD_SIZE=4"),
            std::string::npos);
  EXPECT_NE(config_error({{"RANK", "one"}, {"WORLD_SIZE", "4"}}).find("RANK=one is not an integer"),
            std::string::npos);
  EXPECT_NE(config_error({{"RANK", "1x"}, {"WORLD_SIZE", "4"}}).find("not an integer"), std::string::npos);
  EXPECT_NE(config_error({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}).find("RANK=-1 is outside"),
            std::string::npos);
  EXPECT_NE(config_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}).find("WORLD_SIZE=0 is outside"),
            std::string::npos);
  EXPECT_NE(config_error({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}}).find("WORLD_SIZE=99999999999"),
            std::string::npos);
  EXPECT_NE(config_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}}).find("MASTER_ADDR is not set"),
            std::string::npos);
  EXPECT_NE(config_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", ""}})
                .find("MASTER_ADDR is set but empty"),
            std::string::npos);
  EXPECT_NE(config_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})
                .find("MASTER_PORT=70000 is outside [1, 65535]"),
            std::string::npos);
  EXPECT_NE(config_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"LOCAL_RANK", "2"}})
                .find("LOCAL_RANK=2 but WORLD_SIZE=2"),
            std::string::npos);
}

TEST(LauncherEnv, OpenMpi) {
  Environment env{{"OMPI_COMM_WORLD_RANK", "3"},
                  {"OMPI_COMM_WORLD_SIZE", "4"},
                  {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};
  RankInfo i = rank_from_env(env);
  EXPECT_EQ(i.launcher, "openmpi");
  EXPECT_EQ(i.rank, 3);
  EXPECT_EQ(i.world_size, 4);
  EXPECT_EQ(i.local_rank, 3);
  EXPECT_EQ(i.local_world_size, 4);
  EXPECT_EQ(i.master_addr, "127.0.0.1");    // every rank on this host
  env["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";  // two hosts: rank 0's host must be given
  EXPECT_NE(config_error(env).find("mpirun -x MASTER_ADDR"), std::string::npos);
  env["MASTER_ADDR"] = "head";
  EXPECT_EQ(rank_from_env(env).master_addr, "head");
  EXPECT_NE(config_error({{"OMPI_COMM_WORLD_RANK", "0"}}).find("OMPI_COMM_WORLD_SIZE is not set"),
            std::string::npos);
}

TEST(LauncherEnv, Slurm) {
  Environment env{{"SLURM_PROCID", "5"},
                  {"SLURM_NTASKS", "8"},
                  {"SLURM_LOCALID", "1"},
                  {"SLURM_JOB_NODELIST", "node[01-04]"},
                  {"SLURM_NODELIST", "other"}};
  RankInfo i = rank_from_env(env);
  EXPECT_EQ(i.launcher, "slurm");
  EXPECT_EQ(i.rank, 5);
  EXPECT_EQ(i.world_size, 8);
  EXPECT_EQ(i.local_rank, 1);
  EXPECT_EQ(i.local_world_size, 0);
  EXPECT_EQ(i.master_addr, "node01");
  EXPECT_EQ(i.master_port, 29500);
  env.erase("SLURM_JOB_NODELIST");
  env["SLURM_NODELIST"] = "a,b";
  EXPECT_EQ(rank_from_env(env).master_addr, "a");
  env["MASTER_ADDR"] = "10.0.0.7";  // an explicit address wins over the node list
  env["MASTER_PORT"] = "4000";
  EXPECT_EQ(rank_from_env(env).master_addr, "10.0.0.7");
  EXPECT_EQ(rank_from_env(env).master_port, 4000);
  env["SLURM_NTASKS_PER_NODE"] = "2";
  EXPECT_EQ(rank_from_env(env).local_world_size, 2);
  env["SLURM_NTASKS_PER_NODE"] = "2(x4)";  // an uneven layout's notation: not known
  EXPECT_EQ(rank_from_env(env).local_world_size, 0);
  // SLURM_NPROCS stands in for SLURM_NTASKS; without any node list the host is unknown.
  EXPECT_EQ(rank_from_env({{"SLURM_PROCID", "0"}, {"SLURM_NPROCS", "2"}, {"SLURM_NODELIST", "x"}}).world_size,
            2);
  EXPECT_NE(config_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}).find("SLURM_JOB_NODELIST"),
            std::string::npos);
  EXPECT_NE(config_error({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODELIST", "x"}})
                .find("SLURM_PROCID=2 but SLURM_NTASKS=2"),
            std::string::npos);
}

TEST(LauncherEnv, PrecedenceTorchrunThenOpenMpiThenSlurm) {
  Environment env{{"RANK", "1"},
                  {"WORLD_SIZE", "2"},
                  {"MASTER_ADDR", "h"},
                  {"OMPI_COMM_WORLD_RANK", "0"},
                  {"OMPI_COMM_WORLD_SIZE", "2"},
                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                  {"SLURM_PROCID", "0"},
                  {"SLURM_NTASKS", "1"}};
  EXPECT_EQ(rank_from_env(env).launcher, "torchrun");
  EXPECT_EQ(rank_from_env(env).rank, 1);
  env.erase("RANK");
  EXPECT_EQ(rank_from_env(env).launcher, "openmpi");  // mpirun inside a Slurm batch step
  EXPECT_EQ(rank_from_env(env).rank, 0);
  env.erase("OMPI_COMM_WORLD_RANK");
  EXPECT_EQ(rank_from_env(env).launcher, "slurm");
}

TEST(LauncherEnv, FirstSlurmHost) {
  EXPECT_EQ(first_slurm_host("node01"), "node01");
  EXPECT_EQ(first_slurm_host("a,b,c"), "a");
  EXPECT_EQ(first_slurm_host("node[01-04]"), "node01");
  EXPECT_EQ(first_slurm_host("node[07,01-04]"), "node07");
  EXPECT_EQ(first_slurm_host("gpu-[3,5],cpu[1-2]"), "gpu-3");
  EXPECT_EQ(first_slurm_host("rack[2-3]-n[05-06]"), "rack2-n05");
  EXPECT_THROW(first_slurm_host(""), ConfigError);
  EXPECT_THROW(first_slurm_host("node[01-"), ConfigError);
  EXPECT_THROW(first_slurm_host("node[]"), ConfigError);
}

TEST(LauncherEnv, ReadsTheProcessEnvironment) {
  ::setenv("PIPETRAIN_RENDEZVOUS_TEST", "a=b", 1);
  const Environment env = process_environment();
  ASSERT_TRUE(env.count("PIPETRAIN_RENDEZVOUS_TEST"));
  EXPECT_EQ(env.at("PIPETRAIN_RENDEZVOUS_TEST"), "a=b");
  ::unsetenv("PIPETRAIN_RENDEZVOUS_TEST");
}

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
    o.backend = "ucx";
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
      o.backend = "ucx";
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
    o.backend = "ucx";
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

}  // namespace
