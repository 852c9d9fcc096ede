// Transfers between two processes on one GPU, through the Transport API as the pipeline uses it:
// a CUDA tensor sent by rank 0's thread and received on rank 1's (and back), per transport (nccl,
// ucx, gloo) and size, against a device-to-device copy (cudaMemcpy through ATen's copy_) on the
// same GPU. One JSON line per measurement, appended to OUT:
//   {"bench":"transfer","transport":"nccl","from":0,"to":1,"bytes":67108864,"iters":10,
//    "gbps_median":..,"gbps_min":..,"gbps_max":..,"device":"NVIDIA H100 ..."}
// GB/s are 1e9 bytes per second of payload as the receiver sees them streaming in: from the
// return of its first receive to its stream having finished the last (messages 2..n; the sender
// posts all n back to back, from tensors made and filled before the clock starts, so neither
// the fills nor the store's go and done count), with n the larger of --iters (at least 2) and
// enough messages to carry --min-bytes (default 1 GiB; at most 1024 messages). The last received
// tensor's content is checked. send_us_median and recv_us_median: the sender's time per send()
// call (posting all n) and the median of the receiver's recv() calls (messages 2..n), medians
// over the rounds: which side sets the pace.
// NCCL runs its two ranks on one GPU with a host id each (NCCL_HOSTID; sockets on lo): a test-only
// arrangement, slow by design (docs/gpu.md). UCX carries device memory where it has CUDA
// (UCX_CUDA=1 in `pipetrain --version`), through the host otherwise; Gloo stages through pinned
// host memory. The copy first, then ucx, nccl and gloo, each in processes of its own killed after
// kChildSeconds: a transport that hangs costs its own time, not the others' lines.
//
//   transfer_gpu OUT.jsonl [--transports ucx,nccl,gloo] [--sizes 1048576,16777216,67108864] [--iters 10]
//                [--device cuda|cpu] [--label TEXT] [--min-bytes B] [--read-ahead N]
// --read-ahead: UCX's TransportOptions::read_ahead (0: each message's rendezvous after the last's).
// --label adds "label": TEXT to every line (bench/gpu.sh: the UCX settings of a run).
// --device cpu runs the same exchange with host tensors (no nccl), which checks the harness
// where there is no GPU.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/process_group.h"
#include "comm/rendezvous.h"
#include "comm/transport.h"
#include "common/config.h"
#include "common/error.h"

using namespace pipetrain;
using namespace pipetrain::comm;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ',')) out.push_back(part);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

constexpr double kWait = 60;
constexpr unsigned kChildSeconds = 75;
constexpr int kRepeats = 5;
int64_t min_bytes = int64_t{1} << 30;  // --min-bytes: each measurement carries at least this much
constexpr int kMaxMessages = 1024;
constexpr int kPool = 16;  // distinct tensors the sender cycles through
bool on_gpu = true;        // --device
std::string label;         // --label
int read_ahead = 2;        // --read-ahead: UCX's TransportOptions::read_ahead

// Messages per measurement: at least `iters`, and enough to carry min_bytes.
int messages_for(int64_t bytes, int iters) {
  const int64_t enough = (min_bytes + bytes - 1) / bytes;
  return static_cast<int>(std::max<int64_t>(iters, std::min<int64_t>(enough, kMaxMessages)));
}

// The fields every line ends with.
std::string tail() {
  return pipetrain::detail::concat(",\"device\":\"", on_gpu ? "cuda:0" : "cpu", "\"",
                                   label.empty() ? "" : ",\"label\":\"" + label + "\"", "}\n");
}

void sync_device() {
  if (on_gpu) torch::cuda::synchronize();
}

// One rank's part: every size, both directions; rank 0 appends the lines.
void rank_main(int rank, int port, const std::string& transport, const std::vector<int64_t>& sizes, int iters,
               const std::string& out) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = rank == 0;
  so.numWorkers = 2;
  so.waitWorkers = true;
  so.timeout = std::chrono::seconds(static_cast<int>(kWait));
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  TransportOptions o;
  o.backend = pipetrain::comm::parse_backend(transport);
  o.device = on_gpu ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  o.timeout_s = kWait;
  o.detect_peer_failure = false;  // UCX: shared memory and cuda_ipc between the two
  o.read_ahead = read_ahead;
  std::unique_ptr<Transport> t;
  if (transport == "nccl" || transport == "gloo") {
    t = make_group_transport(o, store, "bench/", rank, 2, "lo");
  } else {
    t = make_process_transport(o, rank, 2, [&](const std::string& mine) {
      store->set(pipetrain::detail::concat("addr/", rank), std::vector<uint8_t>(mine.begin(), mine.end()));
      std::vector<std::string> all(2);
      for (int r = 0; r < 2; ++r) {
        const auto bytes = store->get(pipetrain::detail::concat("addr/", r));
        all[r] = std::string(bytes.begin(), bytes.end());
      }
      return all;
    });
  }
  int64_t round = 0;
  for (int64_t bytes : sizes)
    for (int from : {0, 1}) {
      std::vector<double> gbps, post_us, recv_us_all;
      const int to = 1 - from, n = messages_for(bytes, iters);
      // The sender's tensors, made and filled before the clock starts; message i carries pool[i %
      // kPool], whose every element is its index (checked on the last message).
      std::vector<at::Tensor> pool;
      if (rank == from)
        for (int k = 0; k < std::min(n, kPool); ++k)
          pool.push_back(at::full({bytes / 4}, static_cast<float>(k), at::TensorOptions().dtype(at::kFloat).device(o.device)));
      sync_device();
      for (int rep = 0; rep < kRepeats + 1; ++rep, ++round) {  // the first round warms up
        const std::string done = pipetrain::detail::concat("done/", round), go = pipetrain::detail::concat("go/", round);
        if (rank == to) store->set(go, {1});
        store->wait({go});
        Clock::time_point t0;
        const auto posting = Clock::now();
        std::vector<double> recv_us;  // each recv() call's time, messages 2..n
        for (int i = 0; i < n; ++i) {
          const MessageId id{Kind::Activation, i, 0, round};
          if (rank == from) {
            t->send(to, id, pool[i % pool.size()]);
          } else {
            const auto called = Clock::now();
            at::Tensor got = t->recv(from, id, Deadline::after(kWait));
            if (i > 0) recv_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - called).count());
            if (i == 0) t0 = Clock::now();
            if (i == n - 1) {
              const float want = static_cast<float>((n - 1) % std::min(n, kPool));
              if (got.is_cuda() != on_gpu || got.numel() != bytes / 4 || got.min().item<float>() != want ||
                  got.max().item<float>() != want)
                throw Error(pipetrain::detail::concat(transport, ": received the wrong bytes at ", bytes, " bytes"));
            }
          }
        }
        // Where the time per message goes: the sender's send() calls (posting, a stream sync
        // each) and the receiver's recv() calls, in microseconds.
        const double per_post = std::chrono::duration<double, std::micro>(Clock::now() - posting).count() / n;
        const std::string mine = std::to_string(rank == from ? per_post : median(recv_us));
        store->set(pipetrain::detail::concat(rank == from ? "post/" : "recvus/", round),
                   std::vector<uint8_t>(mine.begin(), mine.end()));
        sync_device();
        if (rank == to) {
          const double s = std::chrono::duration<double>(Clock::now() - t0).count();
          const std::string text = std::to_string(static_cast<double>(bytes) * (n - 1) / s / 1e9);
          store->set(done, std::vector<uint8_t>(text.begin(), text.end()));
        }
        auto number = [&](const std::string& key) {
          const std::vector<uint8_t> text = store->get(key);
          return std::stod(std::string(text.begin(), text.end()));
        };
        const double rate = number(done);
        if (rep > 0) {
          gbps.push_back(rate);
          post_us.push_back(number(pipetrain::detail::concat("post/", round)));
          recv_us_all.push_back(number(pipetrain::detail::concat("recvus/", round)));
        }
      }
      if (rank == 0) {
        std::ofstream f(out, std::ios::app);
        f << "{\"bench\":\"transfer\",\"transport\":\"" << transport << "\",\"from\":" << from << ",\"to\":" << to
          << ",\"bytes\":" << bytes << ",\"iters\":" << n << ",\"timing\":\"receiver, messages 2.." << n << "\""
          << ",\"gbps_median\":" << median(gbps) << ",\"gbps_min\":" << *std::min_element(gbps.begin(), gbps.end())
          << ",\"gbps_max\":" << *std::max_element(gbps.begin(), gbps.end())
          << ",\"send_us_median\":" << median(post_us) << ",\"recv_us_median\":" << median(recv_us_all) << tail();
      }
    }
  t.reset();
}

// A device-to-device copy on the one GPU, the bound a transfer between two processes could reach.
void memcpy_baseline(const std::vector<int64_t>& sizes, int iters, const std::string& out) {
  for (int64_t bytes : sizes) {
    at::Tensor a = at::ones({bytes / 4}, at::TensorOptions().dtype(at::kFloat).device(on_gpu ? at::kCUDA : at::kCPU)),
               b = at::empty_like(a);
    std::vector<double> gbps;
    const int n = messages_for(bytes, iters);
    for (int rep = 0; rep < kRepeats + 1; ++rep) {
      sync_device();
      const auto t0 = Clock::now();
      for (int i = 0; i < n; ++i) b.copy_(a);
      sync_device();
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (rep > 0) gbps.push_back(static_cast<double>(bytes) * n / s / 1e9);
    }
    std::ofstream f(out, std::ios::app);
    f << "{\"bench\":\"transfer\",\"transport\":\"" << (on_gpu ? "cudaMemcpy" : "memcpy") << "\",\"from\":0,\"to\":0,\"bytes\":" << bytes
      << ",\"iters\":" << n << ",\"gbps_median\":" << median(gbps)
      << ",\"gbps_min\":" << *std::min_element(gbps.begin(), gbps.end())
      << ",\"gbps_max\":" << *std::max_element(gbps.begin(), gbps.end()) << tail();
  }
}

// `f` in a process of its own, killed (SIGALRM) after kChildSeconds; an exception is its error line.
pid_t in_child(const std::string& what, const std::function<void()>& f) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(kChildSeconds);
    try {
      f();
      ::_exit(0);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "transfer_gpu: %s: %s\n", what.c_str(), e.what());
      ::_exit(1);
    }
  }
  if (pid < 0) std::fprintf(stderr, "transfer_gpu: %s: fork failed\n", what.c_str());
  return pid;
}

// Waits for the children; false when one failed or ran out of time (said).
bool finished(const std::vector<pid_t>& pids, const std::string& what) {
  bool ok = true;
  for (pid_t pid : pids) {
    int st = 0;
    if (pid < 0 || ::waitpid(pid, &st, 0) < 0) {
      ok = false;
      continue;
    }
    if (WIFSIGNALED(st))
      std::fprintf(stderr, "transfer_gpu: %s: %s\n", what.c_str(),
                   WTERMSIG(st) == SIGALRM ? pipetrain::detail::concat("over ", kChildSeconds, " s, stopped").c_str()
                                           : pipetrain::detail::concat("killed by signal ", WTERMSIG(st)).c_str());
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ok = false;
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: transfer_gpu OUT.jsonl [--transports nccl,ucx,gloo] [--sizes B,...] [--iters N] [--device cuda|cpu] [--label TEXT] [--min-bytes B] [--read-ahead N]\n");
    return 2;
  }
  const std::string out = argv[1];
  std::vector<std::string> transports{"ucx", "nccl", "gloo"};
  std::vector<int64_t> sizes{1 << 20, 16 << 20, 64 << 20};
  int iters = 10;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--transports") transports = split(value);
    else if (flag == "--sizes") {
      sizes.clear();
      for (const auto& s : split(value)) sizes.push_back(std::stoll(s));
    } else if (flag == "--iters") iters = std::max(2, std::stoi(value));
    else if (flag == "--device") on_gpu = value != "cpu";
    else if (flag == "--label") label = value;
    else if (flag == "--min-bytes") min_bytes = std::stoll(value);
    else if (flag == "--read-ahead") read_ahead = std::stoi(value);
    else {
      std::fprintf(stderr, "transfer_gpu: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  // Every CUDA and NCCL call happens in the children, forked before anything initialized CUDA.
  bool ok = finished({in_child("cudaMemcpy", [&] { memcpy_baseline(sizes, iters, out); })}, "cudaMemcpy");
  for (const auto& transport : transports) {
    if (!has_transport_backend(transport) || (!on_gpu && transport == "nccl")) {
      std::fprintf(stderr, "transfer_gpu: %s %s; skipped\n", transport.c_str(),
                   has_transport_backend(transport) ? "carries GPU tensors only" : "is not compiled in");
      continue;
    }
    const int port = free_loopback_port();
    std::vector<pid_t> pids;
    for (int rank = 0; rank < 2; ++rank)
      pids.push_back(in_child(pipetrain::detail::concat(transport, " rank ", rank), [&, rank] {
        ::setenv("NCCL_HOSTID", pipetrain::detail::concat("pipetrain-bench-host-", rank).c_str(), 1);
        ::setenv("NCCL_SOCKET_IFNAME", "lo", 1);
        ::setenv("NCCL_IB_DISABLE", "1", 1);
        prepare_nccl_environment();
        rank_main(rank, port, transport, sizes, iters, out);
      }));
    ok = finished(pids, transport) && ok;
  }
  return ok ? 0 : 1;
}
