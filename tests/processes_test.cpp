// runtime.kind processes as a user runs it: one pipetrain process per stage, started by
// `pipetrain launch`, by hand with torchrun-style variables, by mpirun, or in two network
// namespaces; the same losses as the in-process runtime; ranks that die or stop answering; a
// peer that sends a malformed header; checkpoints, resume, SIGTERM and evaluation across ranks.
// Every wait is bounded: each rank runs under a deadline and is killed when it passes.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "comm/launcher_env.h"
#include "comm/rendezvous.h"
#include "comm/transport.h"
#include "common/config.h"
#include "common/error.h"
#if PIPETRAIN_HAVE_UCX
#include "comm/ucx/ucx_transport.h"
#endif
#include <torch/torch.h>

#include "pipeline/pipeline.h"
#include "train/config.h"
#include "train/trainer.h"
#include "tests/process_helpers.h"

namespace {

using pipetrain::detail::concat;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using pipetrain::test::free_port;
using pipetrain::test::Result;
using pipetrain::test::shell;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string temp(const std::string& name) {
  return ::testing::TempDir() + "/pipetrain_proc_" + std::to_string(::getpid()) + "_" + name;
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = temp(name);
  std::ofstream(path) << text;
  return path;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every command line runs under `timeout`, so a hang fails the test instead of the suite.
Result run(const std::string& args) {
  return shell("timeout -s KILL 150 " + std::string(PIPETRAIN_BINARY) + " " + args + " 2>&1");
}

// One rank started by hand, as a launcher would: its own environment, output to a file.
struct Rank {
  pid_t pid = -1;
  std::string out_path;
  int status = -1;  // exit status, 128 + signal when killed, -1 while running
  double exited_s = -1;

  std::string out() const { return read_text(out_path); }
};

Rank spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
           const std::string& out_path) {
  Rank r;
  r.out_path = out_path;
  std::fflush(nullptr);  // the child must not write this process's buffered output again
  r.pid = ::fork();
  if (r.pid == 0) {
    ::setpgid(0, 0);
    FILE* f = std::freopen(out_path.c_str(), "w", stdout);
    if (!f || ::dup2(::fileno(stdout), 2) < 0) ::_exit(126);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  return r;
}

// Waits (at most `limit_s` from t0) for each rank of `ranks` that is not in `except`; returns
// whether all of them exited. Ranks still running at the end are killed and reaped.
bool wait_ranks(std::vector<Rank>& ranks, const std::vector<int>& except, Clock::time_point t0, double limit_s) {
  auto skip = [&](int i) { return std::find(except.begin(), except.end(), i) != except.end(); };
  bool all = false;
  while (!all && since(t0) < limit_s) {
    all = true;
    for (size_t i = 0; i < ranks.size(); ++i) {
      Rank& r = ranks[i];
      if (r.status >= 0 || skip(static_cast<int>(i))) continue;
      int st = 0;
      if (::waitpid(r.pid, &st, WNOHANG) == r.pid) {
        r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        r.exited_s = since(t0);
      } else {
        all = false;
      }
    }
    if (!all) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling exits, not synchronising
  }
  for (Rank& r : ranks)
    if (r.status < 0) {
      ::kill(-r.pid, SIGKILL);
      ::kill(r.pid, SIGKILL);
      int st = 0;
      ::waitpid(r.pid, &st, 0);
      r.status = 128 + SIGKILL;
    }
  return all;
}

std::map<std::string, std::string> rank_env(int rank, int world, int port, const std::string& addr = "127.0.0.1") {
  return {{"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(rank)}, {"MASTER_ADDR", addr},
          {"MASTER_PORT", std::to_string(port)}, {"PIPETRAIN_TEST_FAULT", ""}};
}

// The metrics lines of one run, by event: "step" lines keyed by step.
struct Metrics {
  std::map<int, json> steps;
  std::vector<json> evals;
  json test;
};

Metrics read_metrics(const std::string& path) {
  Metrics m;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    json j = json::parse(line);
    const std::string event = j.value("event", "");
    if (event == "test")
      m.test = j;
    else if (event == "eval")
      m.evals.push_back(j);
    else
      m.steps[j.at("step").get<int>()] = j;
  }
  return m;
}

// Bit-identical losses and gradient norms, step by step, and the same test results.
void expect_same_training(const Metrics& a, const Metrics& b, const std::string& what) {
  ASSERT_FALSE(a.steps.empty()) << what;
  ASSERT_EQ(a.steps.size(), b.steps.size()) << what;
  for (const auto& [step, j] : a.steps) {
    ASSERT_TRUE(b.steps.count(step)) << what << ": step " << step;
    EXPECT_EQ(j.at("loss").get<double>(), b.steps.at(step).at("loss").get<double>()) << what << ": step " << step;
    EXPECT_EQ(j.at("grad_norm").get<double>(), b.steps.at(step).at("grad_norm").get<double>())
        << what << ": step " << step;
  }
  ASSERT_EQ(a.evals.size(), b.evals.size()) << what;
  for (size_t i = 0; i < a.evals.size(); ++i)
    EXPECT_EQ(a.evals[i].at("test_loss").get<double>(), b.evals[i].at("test_loss").get<double>()) << what;
  if (!a.test.is_null()) {
    ASSERT_FALSE(b.test.is_null()) << what;
    EXPECT_EQ(a.test.at("test_loss").get<double>(), b.test.at("test_loss").get<double>()) << what;
    EXPECT_EQ(a.test.at("test_accuracy").get<double>(), b.test.at("test_accuracy").get<double>()) << what;
  }
}

const std::string kMlp = R"({
  "model": {"family": "mlp", "in": 8, "width": 16, "layers": 4, "out": 4},
  "data": {"kind": "synthetic", "batch_size": 16, "samples": 128, "test_samples": 32},
  "pipeline": {"stages": 2, "micro_batches": 4},
  "optimizer": {"kind": "adam", "lr": 0.01, "grad_clip": 1.0},
  "train": {"steps": 5},
  "runtime": {"timeout_s": 60}
})";

// Dropout, AdamW with warm-up and cosine decay, evaluation along the way.
const std::string kGpt = R"({
  "model": {"family": "gpt", "vocab_size": 32, "seq_len": 8, "d_model": 16, "n_heads": 2, "n_layers": 3, "dropout": 0.1},
  "data": {"kind": "synthetic", "batch_size": 8, "samples": 64, "test_samples": 16},
  "pipeline": {"stages": 3, "micro_batches": 4, "schedule": "1f1b"},
  "optimizer": {"kind": "adamw", "lr": 0.003, "weight_decay": 0.01, "warmup_steps": 2, "lr_schedule": "cosine"},
  "train": {"steps": 6, "eval_every": 3, "seed": 7},
  "runtime": {"timeout_s": 60}
})";

std::string pipetrain_binary() { return PIPETRAIN_BINARY; }

// Runs `args` (a train command) in-process and as processes under `pipetrain launch`, with
// metrics; returns both.
std::pair<Metrics, Metrics> threads_and_processes(const std::string& name, const std::string& config, int nproc,
                                                  const std::string& extra = "") {
  const std::string cfg = write_file(name + ".json", config);
  const std::string mt = temp(name + "_threads.jsonl"), mp = temp(name + "_processes.jsonl");
  Result t = run("train " + cfg + " --quiet --metrics " + mt + " " + extra);
  EXPECT_EQ(t.status, 0) << t.out;
  Result p = run("launch --nproc " + std::to_string(nproc) + " -- train " + cfg + " --quiet --metrics " + mp + " --set runtime.kind=processes " + extra);
  EXPECT_EQ(p.status, 0) << p.out;
  // Rank 0's metrics cover every stage: each rank sends what it measured.
  for (const auto& [step, j] : read_metrics(mp).steps)
    for (double busy : j.at("stage_busy_ms").get<std::vector<double>>()) EXPECT_GT(busy, 0.0) << name << " step " << step;
  // Rank 0 reports; the other ranks print nothing but errors.
  EXPECT_NE(p.out.find("[rank 0] test accuracy"), std::string::npos) << p.out;
  EXPECT_EQ(p.out.find("[rank 1] test accuracy"), std::string::npos) << p.out;
  return {read_metrics(mt), read_metrics(mp)};
}

}  // namespace

TEST(Processes, SameLossesAsThreads) {
  {
    auto [t, p] = threads_and_processes("mlp", kMlp, 2);
    expect_same_training(t, p, "mlp, gpipe, 2 stages");
  }
  {  // --trace on rank 0 shows every stage's spans
    const std::string cfg = write_file("trace.json", kMlp), trace = temp("trace.json.out");
    Result r = run("launch --nproc 2 -- train " + cfg + " --quiet --trace " + trace + " --set runtime.kind=processes");
    ASSERT_EQ(r.status, 0) << r.out;
    std::map<int, int> forwards;  // per stage (tid)
    const json events = json::parse(read_text(trace));
    for (const json& e : events.at("traceEvents"))
      if (e.at("ph") == "X" && e.at("cat") == "forward") ++forwards[e.at("tid").get<int>()];
    EXPECT_EQ(forwards.size(), 2u) << read_text(trace);
    for (const auto& [tid, n] : forwards) EXPECT_EQ(n, 4) << "stage " << tid;  // one step, 4 micro-batches
  }
  {  // without peer-failure detection UCX may use shared memory between the processes
    auto [t, p] = threads_and_processes("mlp_sm", kMlp, 2, "--set runtime.detect_peer_failure=false");
    expect_same_training(t, p, "mlp, gpipe, 2 stages, shared memory");
  }
  {
    auto [t, p] = threads_and_processes("gpt", kGpt, 3);
    expect_same_training(t, p, "gpt with dropout, 1f1b, 3 stages");
    EXPECT_EQ(p.evals.size(), 1u);
  }
  {
    auto [t, p] = threads_and_processes("interleaved", kGpt, 2,
                                        "--set pipeline.stages=2 --set pipeline.schedule=interleaved-1f1b "
                                        "--set pipeline.recompute=always --set train.accumulate=2");
    expect_same_training(t, p, "gpt, interleaved-1f1b, 2 stages x 2 chunks, accumulation");
  }
}

#if PIPETRAIN_HAVE_UCX
// The pipeline API with one endpoint per rank (here two ranks as threads of the test): every
// rank runs rank 0's layout, e.g. when each would profile its own balance, and the ranks' steps
// equal the in-process pipeline's.
TEST(Processes, EndpointsRunRankZerosLayoutAndMatchThreads) {
  namespace pl = pipetrain::pipeline;
  auto make_model = [] {
    torch::manual_seed(3);
    return torch::nn::Sequential(torch::nn::Linear(6, 12), torch::nn::Tanh(), torch::nn::Linear(12, 12),
                                 torch::nn::Tanh(), torch::nn::Linear(12, 3));
  };
  auto sgd = [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1)); };
  torch::manual_seed(4);
  const at::Tensor x = torch::randn({8, 6}), y = torch::randint(0, 3, {8});
  pl::PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 4;
  o.balance = {2, 3};
  pl::Pipeline reference(make_model(), o, pipetrain::train::mean_cross_entropy);
  reference.set_optimizer(sgd);
  std::vector<double> want;
  for (int s = 0; s < 3; ++s) want.push_back(reference.train_step(x, y));

  auto endpoints = pipetrain::comm::make_ucx_group(2);
  std::vector<torch::nn::Sequential> models{make_model(), make_model()};  // seeded: not in the threads
  std::vector<std::vector<double>> got(2);
  std::vector<pipetrain::partitioner::Balance> balances(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        pl::PipelineOptions mine = o;
        mine.balance = r == 0 ? pipetrain::partitioner::Balance{2, 3} : pipetrain::partitioner::Balance{4, 1};
        pl::Pipeline pipe(models[r], mine, pipetrain::train::mean_cross_entropy, std::move(endpoints[r]));
        pipe.set_optimizer(sgd);
        balances[r] = pipe.balance();
        // The other rank's layers are released here; this rank's keep their weights.
        for (int vs = 0; vs < 2; ++vs)
          for (const auto& t : pipe.stage_layers(vs)->parameters())
            if ((t.numel() > 0) != (vs == r)) errors[r] += concat("stage ", vs, " has ", t.numel(), " values; ");
        for (int s = 0; s < 3; ++s) got[r].push_back(pipe.train_step(x, y));
        pipe.barrier();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(balances[r], (pipetrain::partitioner::Balance{2, 3})) << "rank " << r;
    EXPECT_EQ(got[r], want) << "rank " << r;  // every rank returns the loss, bit for bit
  }
}
#endif

TEST(Processes, Mpirun) {
  if (shell("command -v mpirun").status != 0) GTEST_SKIP() << "mpirun is not installed (scripts/setup.sh installs openmpi-bin)";
  const std::string cfg = write_file("mpi.json", kMlp);
  const std::string mt = temp("mpi_threads.jsonl"), mp = temp("mpi_processes.jsonl");
  Result t = run("train " + cfg + " --quiet --metrics " + mt);
  ASSERT_EQ(t.status, 0) << t.out;
  const std::string port = std::to_string(free_port());
  Result p = shell("MASTER_PORT=" + port + " timeout -s KILL 150 mpirun --allow-run-as-root --oversubscribe -np 2 -x MASTER_PORT " +
                   pipetrain_binary() + " train " + cfg + " --quiet --metrics " + mp +
                   " --set runtime.kind=processes 2>&1");
  ASSERT_EQ(p.status, 0) << p.out;
  EXPECT_NE(p.out.find("test accuracy"), std::string::npos) << p.out;
  expect_same_training(read_metrics(mt), read_metrics(mp), "mpirun");
}

// SIGKILL and SIGSTOP of the first and of the last of three ranks in the middle of a step
// (after its first action): the activations (downstream) and the gradients (upstream)
// direction. Every other rank exits with an error naming the rank within runtime.timeout_s.
TEST(Processes, RankThatDiesOrStopsAnsweringFailsEveryOtherRank) {
  const std::string cfg = write_file("fault.json", kMlp);
  const double timeout_s = 4;
  for (const char* signal : {"kill", "stop"})
    for (int victim : {0, 2}) {
      SCOPED_TRACE(std::string(signal) + " rank " + std::to_string(victim));
      const int port = free_port();
      std::vector<Rank> ranks;
      const auto t0 = Clock::now();
      for (int r = 0; r < 3; ++r) {
        auto env = rank_env(r, 3, port);
        if (r == victim) env["PIPETRAIN_TEST_FAULT"] = std::to_string(victim) + ":2:" + signal;
        ranks.push_back(spawn({pipetrain_binary(), "train", cfg, "--quiet", "--steps", "50", "--set",
                               "pipeline.stages=3", "--set", "runtime.kind=processes", "--set",
                               "runtime.timeout_s=" + std::to_string(timeout_s)},
                              env, temp("fault_" + std::to_string(r) + ".txt")));
      }
      // The moment the victim stops or dies (bounded: start-up and two steps).
      double fault_s = -1;
      while (fault_s < 0 && since(t0) < 60) {
        int st = 0;
        const pid_t got = ::waitpid(ranks[victim].pid, &st, WNOHANG | WUNTRACED);
        if (got == ranks[victim].pid) {
          fault_s = since(t0);
          if (!WIFSTOPPED(st)) ranks[victim].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling the victim, not synchronising
        }
      }
      ASSERT_GE(fault_s, 0) << "the victim never stopped: " << ranks[victim].out();
      const bool exited = wait_ranks(ranks, {victim}, t0, fault_s + 30);
      wait_ranks(ranks, {}, t0, 0);  // the victim: killed (SIGSTOP) or reaped (SIGKILL)
      EXPECT_TRUE(exited);
      for (int r = 0; r < 3; ++r) {
        if (r == victim) continue;
        const std::string out = ranks[r].out();
        EXPECT_EQ(ranks[r].status, 1) << "rank " << r << ": " << out;
        EXPECT_NE(out.find("pipetrain: error: rank "), std::string::npos) << out;
        EXPECT_NE(out.find("rank " + std::to_string(victim)), std::string::npos) << "rank " << r << ": " << out;
        const bool direct = (victim == 0 && r == 1) || (victim == 2 && r == 1);
        if (direct) {  // the neighbour says what it was waiting for
          EXPECT_NE(out.find(victim == 0 ? "activation of micro-batch" : "gradient of micro-batch"), std::string::npos)
              << out;
          if (std::string(signal) == "stop") {
            EXPECT_NE(out.find("timed out"), std::string::npos) << out;
          }
        }
      }
      // From the fault: killed, noticed at once; stopped, at the timeout. The slack covers the
      // survivors' own exit (closing endpoints, freeing libtorch) on a loaded machine.
      const double latest =
          std::max(ranks[(victim + 1) % 3].exited_s, ranks[(victim + 2) % 3].exited_s) - fault_s;
      EXPECT_LT(latest, (std::string(signal) == "stop" ? timeout_s : 0.0) + 5.0);
      std::printf("%s rank %d: the others exited %.2f s after the fault (runtime.timeout_s %.0f)\n", signal, victim,
                  latest, timeout_s);
      if (std::string(signal) == "stop") {
        EXPECT_GE(latest, timeout_s - 1.0);
      }
    }
}

#if PIPETRAIN_HAVE_UCX
// A peer that passes the rendezvous and then sends a malformed header: the pipetrain rank
// refuses it before allocating, names the peer and exits.
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
  options.backend = "ucx";
  auto peer = comm::make_process_transport(options, 1, 2, comm::store_exchange(info, hash, pipetrain::Deadline::after(30)));
  comm::send_raw_header_for_test(*peer, 0, id, std::string(header.begin(), header.end()));
  return wait_ranks(ranks, {}, t0, 30);
}

// Random headers from a peer that passed the rendezvous: `PIPETRAIN_HOSTILE_HEADERS` of them
// (default 4; fuzz/hostile.py runs hundreds), each mutating a valid header at random places
// (or replacing it whole). Rank 0 must exit with status 1 naming rank 1, never crash or hang.
TEST(Processes, RandomHeadersAreRefused) {
  namespace comm = pipetrain::comm;
  const char* count_env = std::getenv("PIPETRAIN_HOSTILE_HEADERS");
  const int count = count_env ? std::atoi(count_env) : 4;
  const std::string cfg = write_file("random_headers.json", kMlp);
  const pipetrain::train::Config config =
      pipetrain::train::load_config(cfg, {"runtime.kind=processes", "runtime.timeout_s=10"});
  const std::string hash = pipetrain::train::run_fingerprint(config, pipetrain::train::train_run_options({}));
  const comm::MessageId id{comm::Kind::Control, 0, static_cast<int>(comm::Exchange::Layout), 0};
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

TEST(Processes, HostilePeerIsRefused) {
  namespace comm = pipetrain::comm;
  const std::string cfg = write_file("hostile.json", kMlp);
  const pipetrain::train::Config config = pipetrain::train::load_config(cfg, {"runtime.kind=processes"});
  const std::string hash = pipetrain::train::run_fingerprint(config, pipetrain::train::train_run_options({}));
  // The header of the first message rank 0 waits for: rank 1's part of the layout exchange.
  const comm::MessageId id{comm::Kind::Control, 0, static_cast<int>(comm::Exchange::Layout), 0};
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

// Checkpoints written by every rank, a run stopped and resumed as processes, SIGTERM to the
// launcher stopping every rank after the same step, and evaluation across ranks.
TEST(Processes, CheckpointResumeSigtermAndEval) {
  const std::string cfg = write_file("ckpt.json", kGpt);
  const std::string dir = temp("ckpt_dir"), mt = temp("ckpt_threads.jsonl"), mp = temp("ckpt_processes.jsonl");
  shell("rm -rf " + dir + " " + mp);
  Result t = run("train " + cfg + " --quiet --metrics " + mt);
  ASSERT_EQ(t.status, 0) << t.out;
  const std::string launch = "launch --nproc 3 -- train " + cfg + " --quiet --metrics " + mp +
                             " --set runtime.kind=processes --checkpoint-dir " + dir;
  Result first = run(launch + " --until-step 4");
  ASSERT_EQ(first.status, 0) << first.out;
  EXPECT_NE(first.out.find("[rank 0] stopped at step 4"), std::string::npos) << first.out;
  const json manifest = json::parse(read_text(dir + "/step-00000004/manifest.json"));
  EXPECT_EQ(manifest.at("shards").size(), 3u);
  Result second = run(launch + " --resume");
  ASSERT_EQ(second.status, 0) << second.out;
  expect_same_training(read_metrics(mt), read_metrics(mp), "stopped at step 4 and resumed, as processes");

  // The final checkpoint evaluated by two processes gives the training run's own test line.
  const size_t at = t.out.find("test accuracy");
  ASSERT_NE(at, std::string::npos) << t.out;
  const std::string test_line = t.out.substr(at, t.out.find(" on ", at) - at);
  Result ev = run("launch --nproc 2 -- eval " + cfg + " --checkpoint " + dir +
                  " --set runtime.kind=processes --set pipeline.stages=2");
  ASSERT_EQ(ev.status, 0) << ev.out;
  EXPECT_NE(ev.out.find("[rank 0] " + test_line), std::string::npos) << ev.out << "\nwant: " << test_line;

  // SIGTERM to the launcher once the first step is logged: each rank finishes the same step,
  // rank 0 writes the checkpoint with every rank's shards, and all exit with 143.
  const std::string dir2 = temp("ckpt_sigterm"), m2 = temp("ckpt_sigterm.jsonl");
  shell("rm -rf " + dir2 + " " + m2);
  // (--foreground: timeout passes SIGTERM to the launcher only, not again to its process group;
  // a second SIGTERM would stop the ranks at once.)
  const std::string cmd = "timeout --foreground -s KILL 150 " + pipetrain_binary() + " launch --nproc 3 -- train " + cfg +
                          " --quiet --steps 100000 --metrics " + m2 + " --set runtime.kind=processes --checkpoint-dir " +
                          dir2 + " > " + temp("sigterm_out.txt") + " 2>&1 & pid=$!; "
                          "for i in $(seq 600); do [ -s " + m2 + " ] && break; sleep 0.1; done; "
                          "kill -TERM $pid; wait $pid; echo \"status=$?\"";
  const std::string out = shell(cmd).out;
  const std::string ranks_out = read_text(temp("sigterm_out.txt"));
  EXPECT_NE(out.find("status=143"), std::string::npos) << out << ranks_out;
  const Metrics m = read_metrics(m2);
  ASSERT_FALSE(m.steps.empty());
  char name[40];
  std::snprintf(name, sizeof name, "/step-%08d/manifest.json", m.steps.rbegin()->first);
  ASSERT_TRUE(std::ifstream(dir2 + name).good()) << ranks_out;
  EXPECT_EQ(json::parse(read_text(dir2 + name)).at("shards").size(), 3u);
}

TEST(Processes, ConfigurationErrors) {
  const std::string cfg = write_file("errors.json", kMlp);
  // No launcher: one rank for two stages.
  Result r = run("train " + cfg + " --set runtime.kind=processes");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("pipeline.stages is 2 and the launcher (none) started 1 rank"), std::string::npos) << r.out;
  r = run("train " + cfg + " --set runtime.kind=processes --set runtime.transport=local");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("runtime.transport"), std::string::npos) << r.out;
  r = run("bench " + cfg + " --set runtime.kind=processes");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("bench/processes.sh"), std::string::npos) << r.out;
  r = run("train " + cfg + " --set runtime.kind=processes --set runtime.detect_peer_failure=maybe");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("runtime.detect_peer_failure"), std::string::npos) << r.out;
  // A rank that never comes: rank 0 names it once runtime.timeout_s has passed.
  {
    const int port = free_port();
    std::vector<Rank> alone;
    const auto t0 = Clock::now();
    alone.push_back(spawn({pipetrain_binary(), "train", cfg, "--quiet", "--set", "runtime.kind=processes", "--set",
                           "runtime.timeout_s=2"},
                          rank_env(0, 2, port), temp("alone.txt")));
    EXPECT_TRUE(wait_ranks(alone, {}, t0, 60));
    EXPECT_EQ(alone[0].status, 1) << alone[0].out();
    EXPECT_NE(alone[0].out().find("rank 0: rendezvous at 127.0.0.1:" + std::to_string(port) +
                                  ": rank 1 did not join before the deadline"),
              std::string::npos)
        << alone[0].out();
  }
  // Ranks with different configurations: both say which rank differs.
  const int port = free_port();
  std::vector<Rank> ranks;
  const auto t0 = Clock::now();
  for (int rank = 0; rank < 2; ++rank)
    ranks.push_back(spawn({pipetrain_binary(), "train", cfg, "--quiet", "--set", "runtime.kind=processes", "--set",
                           rank == 1 ? "optimizer.lr=0.5" : "optimizer.lr=0.01"},
                          rank_env(rank, 2, port), temp("differ_" + std::to_string(rank) + ".txt")));
  EXPECT_TRUE(wait_ranks(ranks, {}, t0, 60));
  for (const Rank& rank : ranks) {
    EXPECT_NE(rank.status, 0) << rank.out();
    EXPECT_NE(rank.out().find("the configuration of rank 1 differs from rank 0's"), std::string::npos) << rank.out();
  }
}

// Intra-op threads: a rank shares its host's cores with the ranks on that host (LOCAL_WORLD_SIZE),
// not with every stage.
TEST(Processes, IntraOpThreadsFollowTheRanksOnTheHost) {
  const std::string cfg = write_file("threads.json", kMlp);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (const char* local : {"1", ""}) {
    SCOPED_TRACE(std::string("LOCAL_WORLD_SIZE=") + local);
    const int port = free_port();
    std::vector<Rank> ranks;
    const auto t0 = Clock::now();
    for (int r = 0; r < 2; ++r) {
      auto env = rank_env(r, 2, port);
      if (*local) env["LOCAL_WORLD_SIZE"] = local;
      ranks.push_back(spawn({pipetrain_binary(), "train", cfg, "--quiet", "--steps", "1", "--set",
                             "runtime.kind=processes"},
                            env, temp("threads_" + std::to_string(r) + ".txt")));
    }
    ASSERT_TRUE(wait_ranks(ranks, {}, t0, 60));
    ASSERT_EQ(ranks[0].status, 0) << ranks[0].out();
    const int want = *local ? cores : std::max(1, cores / 2);  // without it: cores / stages
    EXPECT_NE(ranks[0].out().find(", " + std::to_string(want) + " intra-op threads per stage"), std::string::npos)
        << ranks[0].out();
  }
}

// True once `dev` in namespace `ns` is operationally up (IFF_RUNNING), false at the deadline.
// A veth end turns running about a second after `ip link set up` (the kernel's link watcher);
// UCX lists TCP devices once at start and skips those not running, so a rank started earlier
// advertises only lo and its peer finds it unreachable.
bool wait_link_running(const std::string& ns, const std::string& dev, double limit_s) {
  const auto t0 = Clock::now();
  for (int polls = 0; polls < 10000 && since(t0) < limit_s; ++polls) {
    if (shell("ip netns exec " + ns + " cat /sys/class/net/" + dev + "/operstate 2>/dev/null").out == "up\n") {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Two hosts: two network namespaces joined by a veth pair, one rank in each, over UCX tcp.
TEST(Processes, TwoNetworkNamespacesOverTcp) {
  const std::string tag = std::to_string(::getpid() % 100000);
  const std::string a = "pta" + tag, b = "ptb" + tag;
  const int subnet = static_cast<int>(::getpid() % 200) + 20;
  const std::string ip_a = "10.213." + std::to_string(subnet) + ".1", ip_b = "10.213." + std::to_string(subnet) + ".2";
  const std::string setup =
      "ip netns add " + a + " && ip netns add " + b + " && ip link add va" + tag + " netns " + a +
      " type veth peer name vb" + tag + " netns " + b + " && ip -n " + a + " addr add " + ip_a + "/24 dev va" + tag +
      " && ip -n " + b + " addr add " + ip_b + "/24 dev vb" + tag + " && ip -n " + a + " link set va" + tag +
      " up && ip -n " + b + " link set vb" + tag + " up && ip -n " + a + " link set lo up && ip -n " + b +
      " link set lo up";
  const Result made = shell("(" + setup + ") 2>&1");
  auto cleanup = [&] { shell("ip netns del " + a + " 2>/dev/null; ip netns del " + b + " 2>/dev/null"); };
  if (made.status != 0) {
    cleanup();
    GTEST_SKIP() << "cannot create network namespaces here (needs root or CAP_NET_ADMIN and veth): " << made.out;
  }
  for (const auto& [ns, dev] : {std::pair{a, "va" + tag}, std::pair{b, "vb" + tag}}) {
    if (!wait_link_running(ns, dev, 10)) {
      cleanup();
      FAIL() << dev << " in namespace " << ns << " is not running 10 s after `ip link set up`";
    }
  }
  const std::string cfg = write_file("netns.json", kMlp);
  const std::string mt = temp("netns_threads.jsonl"), mp = temp("netns_processes.jsonl");
  const int port = free_port();
  std::vector<Rank> ranks;
  const auto t0 = Clock::now();
  for (int r = 0; r < 2; ++r) {
    auto env = rank_env(r, 2, port, ip_a);
    env["UCX_TLS"] = "tcp";
    std::vector<std::string> argv{"ip", "netns", "exec", r == 0 ? a : b, pipetrain_binary(), "train", cfg, "--quiet",
                                  "--set", "runtime.kind=processes", "--set", "runtime.timeout_s=30"};
    if (r == 0) argv.insert(argv.end(), {"--metrics", mp});
    ranks.push_back(spawn(argv, env, temp("netns_" + std::to_string(r) + ".txt")));
  }
  const bool exited = wait_ranks(ranks, {}, t0, 90);
  cleanup();
  Result t = run("train " + cfg + " --quiet --metrics " + mt);
  EXPECT_EQ(t.status, 0) << t.out;
  ASSERT_TRUE(exited) << ranks[0].out() << ranks[1].out();
  ASSERT_EQ(ranks[0].status, 0) << ranks[0].out();
  ASSERT_EQ(ranks[1].status, 0) << ranks[1].out();
  expect_same_training(read_metrics(mt), read_metrics(mp), "two namespaces over tcp");
}
