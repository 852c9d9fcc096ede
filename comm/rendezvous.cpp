#include "comm/rendezvous.h"

#include "comm/address_record.h"
#include "common/broken_pipe.h"

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "common/error.h"
#include "common/hash.h"
#include "common/strings.h"

namespace pipetrain::comm {

namespace {

std::chrono::milliseconds left(Deadline deadline) {
  // c10d reads a zero timeout as "wait forever": never pass less than a millisecond.
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline.at - Clock::now());
  return std::max(ms, std::chrono::milliseconds(1));
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

std::string list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

// Whether something accepts connections at host:port now (a plain connect, no retries).
bool listening(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool ok = false;
  for (addrinfo* a = found; a && !ok; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    ok = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return ok;
}

// A socket listening on host:port only (not on every interface), for the store's server to
// take over. Throws TransportError with the system's reason.
int listen_on(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0)
    throw TransportError(0, detail::concat("rank 0: cannot resolve MASTER_ADDR ", host, ": ", ::gai_strerror(rc)));
  std::string why = "no address";
  int fd = -1;
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0)
    throw TransportError(0, detail::concat("rank 0: cannot listen on ", host, ":", port, ": ", why));
  return fd;
}

c10::intrusive_ptr<c10d::TCPStore> connect(const RankInfo& info, bool server,
                                           std::chrono::milliseconds timeout) {
  ignore_broken_pipe();  // a rank whose store went away gets an error naming it, not SIGPIPE
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(info.master_port);
  o.isServer = server;
  // The server takes over a socket bound to MASTER_ADDR alone, so the store is not reachable
  // on the host's other interfaces.
  if (server) o.masterListenFd = listen_on(info.master_addr, info.master_port);
  o.numWorkers = static_cast<size_t>(info.world_size);
  o.waitWorkers = false;  // our own waits name the ranks that are missing
  o.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(info.master_addr, o);
}

// A client of rank 0's store, connected before `deadline`. c10d's client blocks without a bound
// while whatever listens at the address accepts and never answers (rank 0 stopped during the
// rendezvous, a stale or foreign program on the port): the attempt runs on a thread of its own,
// left behind (with its socket) when the deadline passes first.
c10::intrusive_ptr<c10d::TCPStore> connect_by(const RankInfo& info, std::chrono::milliseconds timeout,
                                              Deadline deadline, const std::string& where) {
  struct Attempt {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    c10::intrusive_ptr<c10d::TCPStore> store;
    std::exception_ptr error;
  };
  auto a = std::make_shared<Attempt>();
  std::thread([a, info, timeout] {
    c10::intrusive_ptr<c10d::TCPStore> store;
    std::exception_ptr error;
    try {
      store = connect(info, false, timeout);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(a->mu);
    a->store = std::move(store);
    a->error = error;
    a->done = true;
    a->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(a->mu);
  if (!a->cv.wait_until(lock, deadline.at, [&] { return a->done; }))
    throw TimeoutError(0, detail::concat("rank ", info.rank, ": something accepts connections at ", where,
                                         " but does not answer as a rendezvous store before the deadline (rank 0 "
                                         "stopped or hung, or another program holds the port)"));
  if (a->error) std::rethrow_exception(a->error);
  return a->store;
}

class Rendezvous {
 public:
  Rendezvous(const RankInfo& info, Deadline deadline, const std::string& prefix)
      : info_(info),
        deadline_(deadline),
        prefix_(prefix + "/"),
        where_(detail::concat(info.master_addr, ":", info.master_port)) {
    if (info.world_size < 1 || info.rank < 0 || info.rank >= info.world_size)
      throw ConfigError(
          detail::concat("rendezvous: rank ", info.rank, " outside world of size ", info.world_size));
    try {
      if (info.rank != 0) wait_for_server();
      // c10d's client counts its connect timeout in whole seconds and gives up a second early;
      // the server is known to listen by now, so the first attempt connects.
      const auto timeout = std::max(left(deadline), std::chrono::milliseconds(3000));
      store_ = info.rank == 0 ? connect(info, true, timeout) : connect_by(info, timeout, deadline, where_);
    } catch (const TimeoutError&) {
      throw;
    } catch (const std::exception& e) {
      if (info.rank == 0)
        throw TransportError(
            0, detail::concat("rank 0: cannot serve the rendezvous store at ", where_, ": ", e.what()));
      throw TimeoutError(0, detail::concat("rank ", info.rank, ": cannot reach rank 0's rendezvous store at ",
                                           where_, " before the deadline: ", e.what()));
    }
  }

  // c10d's client retries a refused connection once a second; polling the port in small steps
  // keeps both the deadline and a late rank 0 precise.
  void wait_for_server() const {
    auto pause = std::chrono::milliseconds(2);
    while (!listening(info_.master_addr, info_.master_port)) {  // ends by the deadline
      if (deadline_.passed())
        throw TimeoutError(
            0, detail::concat("rank ", info_.rank, ": cannot reach rank 0's rendezvous store at ", where_,
                              " before the deadline"));
      std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline_.at - Clock::now()));
      pause = std::min(pause * 2, std::chrono::milliseconds(100));
    }
  }

  // This job's identity and this rank's place in it. Rank 0 records the job's run token; every
  // other rank checks it, so that a rank of another job on the same port is refused, naming
  // both; and every rank claims its rank's slot atomically, so that a second process claiming
  // the same rank (another job without a token, a rank started twice) is refused, naming the first.
  void claim() {
    const std::string token_key = prefix_ + "run_token";
    const std::string token = "=" + info_.run_token;  // "=": an empty token is a value too
    if (info_.rank == 0) {
      store_->compareSet(token_key, {}, bytes(token));
    } else {
      try {
        store_->wait({token_key}, left(deadline_));
      } catch (const std::exception& e) {
        throw TimeoutError(0, detail::concat("rank ", info_.rank, ": rendezvous at ", where_,
                                             ": rank 0 did not say which job it serves before the deadline"));
      }
      const std::string theirs = text(store_->get(token_key));
      if (theirs != token)
        throw ConfigError(detail::concat(
            "rank ", info_.rank, ": the rendezvous store at ", where_, " serves another job (run token \"",
            printable(theirs.substr(1), 80), "\", this rank's \"", printable(info_.run_token, 80),
            "\"): give each job its own port (MASTER_PORT, pipetrain launch --master-port)"));
    }
    char host[256] = {0};
    ::gethostname(host, sizeof host - 1);
    static std::atomic<int> claims{0};  // several ranks of one process (tests) claim apart
    const std::string me = detail::concat(host, ":", ::getpid(), "#", ++claims);
    const std::string holder = text(store_->compareSet(key("claim", info_.rank), {}, bytes(me)));
    if (holder != me)
      throw ConfigError(detail::concat("rank ", info_.rank, ": another process (", printable(holder, 80),
                                       ") already joined the rendezvous at ", where_, " as rank ", info_.rank,
                                       ": two jobs on one port, or a rank started twice; give each job its own "
                                       "port (MASTER_PORT, pipetrain launch --master-port)"));
  }

  std::string key(const char* what, int rank) const { return prefix_ + what + "/" + std::to_string(rank); }
  void set(const char* what, const std::string& value) { store_->set(key(what, info_.rank), bytes(value)); }
  std::string get(const char* what, int rank) { return text(store_->get(key(what, rank))); }
  const c10::intrusive_ptr<c10d::TCPStore>& store() const { return store_; }

  // Waits until every rank has set `what`; on timeout names those that did not.
  void wait_all(const char* what, const char* doing) {
    for (int r = 0; r < info_.world_size; ++r) {
      try {
        store_->wait({key(what, r)}, left(deadline_));
      } catch (const std::exception& e) {
        const std::vector<int> missing = missing_ranks(what, r);
        const bool timed_out = deadline_.passed();
        throw TimeoutError(
            missing.front(),
            detail::concat("rank ", info_.rank, ": rendezvous at ", where_, ": rank",
                           missing.size() > 1 ? "s " : " ", list(missing), " did not ", doing,
                           timed_out ? " before the deadline" : detail::concat(" (", e.what(), ")")));
      }
    }
  }

 private:
  // After a timed-out wait the connection may still receive that wait's late answer, so the
  // ranks are counted over a fresh one; `known` (the rank that was waited for) is the fallback.
  std::vector<int> missing_ranks(const char* what, int known) {
    std::vector<int> missing;
    try {
      auto fresh = connect(info_, false, std::chrono::milliseconds(1000));
      for (int r = 0; r < info_.world_size; ++r)
        if (!fresh->check({key(what, r)})) missing.push_back(r);
    } catch (const std::exception&) {
    }
    if (missing.empty()) missing.push_back(known);
    return missing;
  }

  RankInfo info_;
  Deadline deadline_;
  std::string prefix_, where_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

}  // namespace

std::vector<std::string> rendezvous(const RankInfo& info, const std::string& address,
                                    const std::string& config_hash, Deadline deadline,
                                    const std::string& prefix, const StoreHook& while_up) {
  Rendezvous rv(info, deadline, prefix);
  rv.claim();
  rv.set("address", encode_address_record(info.rank, address));
  rv.set("config", config_hash);
  rv.wait_all("config", "join");

  std::vector<std::string> hashes;
  for (int r = 0; r < info.world_size; ++r) hashes.push_back(rv.get("config", r));
  std::vector<int> differ;
  for (int r = 1; r < info.world_size; ++r)
    if (hashes[r] != hashes[0]) differ.push_back(r);
  std::vector<std::string> addresses;
  for (int r = 0; r < info.world_size; ++r) {
    try {
      addresses.push_back(decode_address_record(rv.get("address", r), r));
    } catch (const Error& e) {
      throw TransportError(r, detail::concat("rank ", info.rank, ": rendezvous at ", info.master_addr, ":",
                                             info.master_port, ": the store's entry ", prefix, "/address/", r,
                                             " is not a valid address record (", e.what(),
                                             "): another client overwrote or damaged it"));
    }
  }

  // Rank 0 serves the store: it stays until every rank has read what it needed (and run its
  // hook), also when the configurations differ or a hook failed, so that every rank reports its
  // own reason rather than a lost store.
  std::exception_ptr hook_error;
  if (differ.empty() && while_up) {
    try {
      while_up(rv.store());
    } catch (...) {
      hook_error = std::current_exception();
    }
  }
  rv.set("done", "1");
  if (hook_error) std::rethrow_exception(hook_error);
  if (info.rank == 0) rv.wait_all("done", "finish reading the rendezvous");
  if (!differ.empty())
    throw ConfigError(detail::concat("rendezvous: the configuration of rank", differ.size() > 1 ? "s " : " ",
                                     list(differ), " differs from rank 0's (hash ", printable(hashes[differ.front()], 40),
                                     " against ", printable(hashes[0], 40),
                                     "): every rank must run the same configuration"));
  return addresses;
}

AddressExchange store_exchange(RankInfo info, std::string config_hash, Deadline deadline,
                               std::string prefix, StoreHook while_up) {
  return [info = std::move(info), hash = std::move(config_hash), deadline, prefix = std::move(prefix),
          while_up = std::move(while_up)](const std::string& mine) {
    return rendezvous(info, mine, hash, deadline, prefix, while_up);
  };
}

std::string interface_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &found) != 0) return "";
  // Connecting a UDP socket sends nothing; it only picks the route, whose local address it binds.
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  bool routed = false;
  for (addrinfo* a = found; a && !routed; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    routed = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
             ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (!routed) return "";
  std::string device;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return "";
  for (ifaddrs* i = ifs; i && device.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != local.ss_family) continue;
    const bool same =
        local.ss_family == AF_INET
            ? reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr ==
                  reinterpret_cast<sockaddr_in*>(&local)->sin_addr.s_addr
            : std::memcmp(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                          &reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr, sizeof(in6_addr)) == 0;
    if (same) device = i->ifa_name;
  }
  ::freeifaddrs(ifs);
  return device;
}

std::string ucx_devices_towards(const std::string& host) {
  std::string device = interface_towards(host);
  if (device.empty()) return "";
  // RDMA ports: /sys/class/infiniband/<device>/ports/<n>.
  std::error_code ec;
  for (const auto& dev : std::filesystem::directory_iterator("/sys/class/infiniband", ec))
    for (const auto& port : std::filesystem::directory_iterator(dev.path() / "ports", ec))
      device += "," + dev.path().filename().string() + ":" + port.path().filename().string();
  return device;
}

int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error(std::string("cannot find a free port: socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const std::string msg = std::strerror(errno);
    ::close(fd);
    throw Error("cannot find a free port: " + msg);
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string config_fingerprint(const std::string& text) { return hex64(fnv1a(text)); }

}  // namespace pipetrain::comm
