// Two processes (fork) talking through the Transport API over UCX or c10d's Gloo (--backend):
// ping-pong latency of an 8-byte message and unidirectional bandwidth at 8 B, 64 KiB and 4 MiB.
// UCX's worker addresses are exchanged over a socketpair made before the fork; Gloo's ranks meet
// in a TCPStore on 127.0.0.1 whose port goes over the same socketpair. Every received tensor is checked
// against the values the sender wrote. Prints one line per measurement:
//   latency <bytes> <median one-way microseconds>
//   bandwidth <bytes> <median MiB/s over windows> <overall MiB/s: all bytes / all time>
// (MiB/s: 2^20 bytes per second, the unit ucx_perftest prints as MB/s). The transports are
// chosen by UCX's own environment (UCX_TLS=tcp, UCX_TLS=sm, ...).
//
//   transport_bench [--backend ucx|gloo] [--iters N] [--sizes 8,65536,4194304] [--no-peer-failure-detection]
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/process_group.h"
#include "comm/rendezvous.h"
#include "comm/transport.h"
#include "common/config.h"
#include "common/error.h"
#if PIPETRAIN_HAVE_UCX
#include "comm/ucx/transport.h"
#endif

using namespace pipetrain;
using namespace pipetrain::comm;

namespace {

using Clock = std::chrono::steady_clock;

void write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) throw std::runtime_error("address exchange: write failed");
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void read_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r <= 0) throw std::runtime_error("address exchange: peer closed the socket");
    p += r;
    n -= static_cast<size_t>(r);
  }
}

// Both ranks write their address, then read the other's: a socketpair holds both in flight.
AddressExchange socket_exchange(int fd, int rank) {
  return [fd, rank](const std::string& mine) {
    const uint64_t len = mine.size();
    write_all(fd, &len, sizeof len);
    write_all(fd, mine.data(), mine.size());
    uint64_t other_len = 0;
    read_all(fd, &other_len, sizeof other_len);
    if (other_len > (1u << 20)) throw std::runtime_error("address exchange: implausible address length");
    std::string other(other_len, '\0');
    read_all(fd, other.data(), other.size());
    std::vector<std::string> all(2);
    all[rank] = mine;
    all[1 - rank] = other;
    return all;
  };
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

constexpr double kWait = 30;

// A tensor of `bytes` bytes whose content depends on `seed`; check() verifies a received one.
at::Tensor payload(int64_t bytes, int64_t seed) {
  return at::arange(seed, seed + bytes, at::kLong).to(at::kByte);
}
void check(const at::Tensor& t, int64_t bytes, int64_t seed) {
  if (t.numel() != bytes)
    throw std::runtime_error(pipetrain::detail::concat("received ", t.numel(), " bytes, expected ", bytes));
  const uint8_t* p = t.data_ptr<uint8_t>();
  for (int64_t i : {int64_t(0), bytes / 2, bytes - 1})
    if (p[i] != static_cast<uint8_t>(seed + i))
      throw std::runtime_error(pipetrain::detail::concat("wrong byte at ", i));
}

// Round trips of an 8-byte message: one-way latency = round trip / 2.
double latency_us(Transport& t, int iters) {
  const int peer = 1 - t.rank();
  at::Tensor msg = payload(8, 7);
  std::vector<double> one_way;
  for (int i = 0; i < iters; ++i) {
    const MessageId id{Kind::Activation, 0, 0, i};
    if (t.rank() == 0) {
      const auto t0 = Clock::now();
      t.send(peer, id, msg);
      check(t.recv(peer, id, Deadline::after(kWait)), 8, 7);
      one_way.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2);
    } else {
      check(t.recv(peer, id, Deadline::after(kWait)), 8, 7);
      t.send(peer, id, msg);
    }
  }
  one_way.erase(one_way.begin(), one_way.begin() + std::min<size_t>(one_way.size(), iters / 10));  // warm-up
  return median(one_way);
}

// Rank 0 sends a window of messages, rank 1 receives them all and acknowledges; bandwidth of
// each window: {median over the windows, all bytes over all time}. Every message sends the same
// tensor, as ucx_perftest sends one buffer: with 16 distinct 4 MiB tensors the sender reads
// from memory instead of the last-level cache and the comparison would measure that.
std::pair<double, double> bandwidth_mib_s(Transport& t, int64_t bytes, int windows, int window) {
  const int peer = 1 - t.rank();
  const at::Tensor msg = payload(bytes, 1);
  const at::Tensor ack = payload(1, 0);
  std::vector<double> rates;
  double total_s = 0;
  for (int w = 0; w < windows + 1; ++w) {  // the first window warms up
    const auto t0 = Clock::now();
    if (t.rank() == 0) {
      for (int m = 0; m < window; ++m) t.send(peer, {Kind::Activation, m, 0, w}, msg);
      t.recv(peer, {Kind::Grad, 0, 0, w}, Deadline::after(kWait));
    } else {
      for (int m = 0; m < window; ++m)
        check(t.recv(peer, {Kind::Activation, m, 0, w}, Deadline::after(kWait)), bytes, 1);
      t.send(peer, {Kind::Grad, 0, 0, w}, ack);
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (w > 0) {
      rates.push_back(static_cast<double>(bytes) * window / s / (1 << 20));
      total_s += s;
    }
  }
  return {median(rates), static_cast<double>(bytes) * window * windows / total_s / (1 << 20)};
}

// Gloo: rank 0 serves a TCPStore on a free loopback port and tells rank 1 which.
std::unique_ptr<Transport> gloo_transport(int rank, int fd, const TransportOptions& options) {
  uint16_t port = 0;
  if (rank == 0) {
    port = static_cast<uint16_t>(free_loopback_port());
    write_all(fd, &port, sizeof port);
  } else {
    read_all(fd, &port, sizeof port);
  }
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = rank == 0;
  o.numWorkers = 2;
  o.waitWorkers = false;
  o.timeout = std::chrono::seconds(30);
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
  return make_group_transport(options, store, "bench/", rank, 2, "lo");
}

int run_rank(const std::string& backend, int rank, int fd, int iters, const std::vector<int64_t>& sizes,
             bool detect_peer_failure) {
  TransportOptions options;
  options.backend = pipetrain::comm::parse_backend(backend);
  options.detect_peer_failure = detect_peer_failure;
  options.timeout_s = kWait;
  std::unique_ptr<Transport> t;
  if (backend == "gloo") t = gloo_transport(rank, fd, options);
#if PIPETRAIN_HAVE_UCX
  if (backend == "ucx") t = make_ucx_transport(rank, 2, socket_exchange(fd, rank), options);
#endif
  if (!t) throw std::runtime_error("backend " + backend + " is not compiled in");
  const double lat = latency_us(*t, iters);
  if (rank == 0) std::printf("latency 8 %.2f\n", lat);
  for (int64_t bytes : sizes) {
    // About 64 MiB per window for large messages, at least 8 and at most 256 messages.
    const int window = static_cast<int>(std::clamp<int64_t>((int64_t(64) << 20) / bytes, 8, 256));
    const int windows = bytes >= (1 << 20) ? 10 : 30;
    const auto [med, overall] = bandwidth_mib_s(*t, bytes, windows, window);
    if (rank == 0) std::printf("bandwidth %lld %.1f %.1f\n", static_cast<long long>(bytes), med, overall);
    std::fflush(stdout);
  }
  // Both sides finish together, so that neither closes while the other still receives.
  const MessageId bye{Kind::Grad, 1, 0, -1};
  t->send(1 - rank, bye, payload(1, 0));
  t->recv(1 - rank, bye, Deadline::after(kWait));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 10000;
  bool detect_peer_failure = true;
  std::string backend = "ucx";
  std::vector<int64_t> sizes{8, 65536, 4194304};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--backend" && i + 1 < argc) {
      backend = argv[++i];
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (a == "--sizes" && i + 1 < argc) {
      sizes.clear();
      std::string list = argv[++i];
      for (size_t pos = 0; pos <= list.size();) {
        const size_t comma = std::min(list.find(',', pos), list.size());
        sizes.push_back(std::stoll(list.substr(pos, comma - pos)));
        pos = comma + 1;
      }
    } else if (a == "--no-peer-failure-detection") {
      detect_peer_failure = false;
    } else {
      std::fprintf(
          stderr,
          "usage: transport_bench [--backend ucx|gloo] [--iters N] [--sizes 8,65536,4194304] "
          "[--no-peer-failure-detection]\n");
      return 2;
    }
  }
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
    std::perror("socketpair");
    return 1;
  }
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("fork");
    return 1;
  }
  const int rank = child == 0 ? 1 : 0;
  ::close(fds[rank == 0 ? 1 : 0]);
  int rc = 0;
  try {
    rc = run_rank(backend, rank, fds[rank == 0 ? 0 : 1], iters, sizes, detect_peer_failure);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    rc = 1;
  }
  if (rank == 1) std::_Exit(rc);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  return rc;
}
