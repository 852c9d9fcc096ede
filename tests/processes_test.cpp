// runtime.kind processes as a user runs it: one pipetrain process per stage, started by
// `pipetrain launch`, by hand with torchrun-style variables, by mpirun, or in two network
// namespaces; the same losses as the in-process runtime; ranks that die or stop answering;
// checkpoints, resume, SIGTERM and evaluation across ranks (hostile_peer_test: malformed headers).
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
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "comm/collectives.h"
#include "comm/launcher_env.h"
#include "comm/rendezvous.h"
#include "comm/transport.h"
#include "common/config.h"
#include "common/error.h"
#if PIPETRAIN_HAVE_UCX
#include "comm/ucx/testing.h"
#include "comm/ucx/transport.h"
#endif
#include <torch/torch.h>

#include "pipeline/pipeline.h"
#include "job/config.h"
#include "train/trainer.h"
#include "tests/process_helpers.h"
#include "tests/ranks.h"

namespace {

using pipetrain::detail::concat;
using json = nlohmann::json;
using namespace pipetrain::test;


// The metrics lines of one run, by event: "step" lines keyed by step.
struct Metrics {
  std::map<int, json> steps;
  std::vector<json> evals;
  std::vector<json> restarts;
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
    else if (event == "restart")
      m.restarts.push_back(j);
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


// Dropout, AdamW with warm-up and cosine decay, evaluation along the way.
const std::string kGpt = R"({
  "model": {"family": "gpt", "vocab_size": 32, "seq_len": 8, "d_model": 16, "n_heads": 2, "n_layers": 3, "dropout": 0.1},
  "data": {"kind": "synthetic", "batch_size": 8, "samples": 64, "test_samples": 16},
  "pipeline": {"stages": 3, "micro_batches": 4, "schedule": "1f1b"},
  "optimizer": {"kind": "adamw", "lr": 0.003, "weight_decay": 0.01, "warmup_steps": 2, "lr_schedule": "cosine"},
  "train": {"steps": 6, "eval_every": 3, "seed": 7},
  "runtime": {"timeout_s": 60}
})";

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
  {  // c10d's Gloo between the processes (and between the threads of the in-process run)
    auto [t, p] = threads_and_processes("mlp_gloo", kMlp, 2, "--set runtime.transport=gloo");
    expect_same_training(t, p, "mlp, gpipe, 2 stages over gloo");
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
  pl::Pipeline reference(make_model(), o, pipetrain::job::mean_cross_entropy);
  reference.optimizers().set(sgd);
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
        pl::Pipeline pipe(models[r], mine, pipetrain::job::mean_cross_entropy, std::move(endpoints[r]));
        pipe.optimizers().set(sgd);
        balances[r] = pipe.balance();
        // The other rank's layers are released here; this rank's keep their weights.
        for (int vs = 0; vs < 2; ++vs)
          for (const auto& t : pipe.stage_layers(vs)->parameters())
            if ((t.numel() > 0) != (vs == r)) errors[r] += concat("stage ", vs, " has ", t.numel(), " values; ");
        for (int s = 0; s < 3; ++s) got[r].push_back(pipe.train_step(x, y));
        pipe.collectives().barrier();
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
// direction, over UCX and over c10d's Gloo. Every other rank exits with an error naming the rank
// within runtime.timeout_s.
TEST(Processes, RankThatDiesOrStopsAnsweringFailsEveryOtherRank) {
  const std::string cfg = write_file("fault.json", kMlp);
  const double timeout_s = 4;
  std::vector<std::string> transports{"gloo"};
  if (PIPETRAIN_HAVE_UCX) transports.insert(transports.begin(), "ucx");
  for (const std::string& transport : transports)
  for (const char* signal : {"kill", "stop"})
    for (int victim : {0, 2}) {
      SCOPED_TRACE(transport + ": " + signal + " rank " + std::to_string(victim));
      const int port = free_port();
      std::vector<Rank> ranks;
      const auto t0 = Clock::now();
      for (int r = 0; r < 3; ++r) {
        auto env = rank_env(r, 3, port);
        if (r == victim) env["PIPETRAIN_FAULT"] = "pipeline.step:" + std::to_string(victim) + ":2:" + signal;
        ranks.push_back(spawn({pipetrain_binary(), "train", cfg, "--quiet", "--steps", "50", "--set",
                               "pipeline.stages=3", "--set", "runtime.kind=processes", "--set",
                               "runtime.timeout_s=" + std::to_string(timeout_s), "--set", "runtime.transport=" + transport},
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
        // One line, prefixed with the rank that says it (started by hand, without pipetrain launch).
        EXPECT_NE(out.find("pipetrain[rank " + std::to_string(r) + "]: error: rank "), std::string::npos) << out;
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
      std::printf("%s: %s rank %d: the others exited %.2f s after the fault (runtime.timeout_s %.0f)\n",
                  transport.c_str(), signal, victim, latest, timeout_s);
      if (std::string(signal) == "stop") {
        EXPECT_GE(latest, timeout_s - 1.0);
      }
    }
}


// pipetrain launch --max-restarts: rank 1 of 3 killed twice (step 3 of the first attempt, step 6
// of the second); every rank is stopped and started again from the latest checkpoint, and the run
// finishes with the losses of an uninterrupted one, each restart and its cause in the metrics.
TEST(Processes, LaunchRestartsAFailedJobFromItsLatestCheckpoint) {
  const std::string cfg = write_file("restart.json", kMlp);
  const std::string dir = temp("restart_ckpt"), plain = temp("restart_plain.jsonl"), healed = temp("restart.jsonl");
  std::filesystem::remove_all(dir);
  const std::string set = " --quiet --set pipeline.stages=3 --set train.steps=10";
  Result u = run("train " + cfg + set + " --metrics " + plain);
  ASSERT_EQ(u.status, 0) << u.out;
  Result r = shell("PIPETRAIN_FAULT=pipeline.step:1:3:kill:0,pipeline.step:1:6:kill:1 timeout -s KILL 240 " +
                   pipetrain_binary() + " launch --nproc 3 --max-restarts 2 -- train " + cfg + set +
                   " --set runtime.kind=processes --set train.checkpoint_every=1 --checkpoint-dir " + dir +
                   " --metrics " + healed + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("restart 1 of at most 2: rank 1 was killed by signal 9"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("restart 2 of at most 2: rank 1 was killed by signal 9"), std::string::npos) << r.out;
  const Metrics a = read_metrics(plain), b = read_metrics(healed);
  expect_same_training(a, b, "restarted twice against uninterrupted");
  ASSERT_EQ(b.restarts.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(b.restarts[i].at("restart").get<int>(), i + 1);
    EXPECT_EQ(b.restarts[i].at("cause").get<std::string>(), "rank 1 was killed by signal 9");
  }
  // Out of restarts: the failure ends the launch with the rank's status.
  std::filesystem::remove_all(dir);
  Result out = shell("PIPETRAIN_FAULT=pipeline.step:1:3:kill:0,pipeline.step:1:3:kill:1 timeout -s KILL 240 " +
                     pipetrain_binary() + " launch --nproc 3 --max-restarts 1 -- train " + cfg + set +
                     " --set runtime.kind=processes --set train.checkpoint_every=1 --checkpoint-dir " + dir + " 2>&1");
  EXPECT_EQ(out.status, 128 + SIGKILL) << out.out;
  EXPECT_NE(out.out.find("rank 1 failed (status 137) after 1 restart"), std::string::npos) << out.out;
}

// A rank whose slot is gone for good (stage 2 fails in the first two attempts): after it failed
// first twice in a row the launcher goes on with one rank fewer, the train command on 2 stages
// from the latest complete checkpoint (re-partitioned), and the run ends with the uninterrupted
// run's losses, to float rounding (another partition of the same layers). A configuration error
// (status 2) is not restarted.
TEST(Processes, LaunchShrinksOntoFewerStagesWhenARanksSlotIsGone) {
  const std::string cfg = write_file("shrink.json", kMlp);
  const std::string dir = temp("shrink_ckpt"), plain = temp("shrink_plain.jsonl"), healed = temp("shrink.jsonl");
  std::filesystem::remove_all(dir);
  std::filesystem::remove(healed);
  const std::string set = " --quiet --set pipeline.stages=3 --set train.steps=10";
  Result u = run("train " + cfg + set + " --metrics " + plain);
  ASSERT_EQ(u.status, 0) << u.out;
  Result r = shell("PIPETRAIN_FAULT=pipeline.step:2:3:kill:0,pipeline.step:2:6:kill:1 timeout -s KILL 240 " +
                   pipetrain_binary() + " launch --nproc 3 --max-restarts 3 --min-nproc 2 -- train " + cfg + set +
                   " --set runtime.kind=processes --set train.checkpoint_every=1 --checkpoint-dir " + dir +
                   " --metrics " + healed + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("restart 2 of at most 3: rank 2 was killed by signal 9; rank 2 failed first twice in a row, "
                       "so its slot is taken as gone: continuing on 2 ranks (--min-nproc 2)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("continuing on 2 stages instead of 3 (2 of the 3 ranks first started"), std::string::npos) << r.out;
  const Metrics a = read_metrics(plain), b = read_metrics(healed);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (const auto& [step, j] : a.steps) {
    ASSERT_TRUE(b.steps.count(step)) << "step " << step;
    const double x = j.at("loss").get<double>(), y = b.steps.at(step).at("loss").get<double>();
    EXPECT_NEAR(x, y, 1e-5 * std::abs(x)) << "step " << step;
  }
  ASSERT_EQ(b.restarts.size(), 2u);
  EXPECT_EQ(b.restarts[1].at("cause").get<std::string>(), "rank 2 was killed by signal 9; shrunk to 2 ranks");

  // Shrinking below what the copies need is a configuration error (status 2), and the launcher
  // does not restart after one: it would fail again.
  Result bad = shell("PIPETRAIN_SHRUNK=4 WORLD_SIZE=3 RANK=0 " + pipetrain_binary() + " train " + cfg +
                     " --quiet --set pipeline.data_parallel=2 --set runtime.kind=processes 2>&1");
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_NE(bad.out.find("pipetrain launch shrank the job to 3 ranks, which cannot hold 2 data-parallel copies"),
            std::string::npos)
      << bad.out;
  Result again = shell("timeout -s KILL 120 " + pipetrain_binary() + " launch --nproc 2 --max-restarts 3 -- train " +
                       temp("no_such_config.json") + " 2>&1");
  EXPECT_EQ(again.status, 2) << again.out;
  EXPECT_NE(again.out.find("exited with status 2, a usage or configuration error, which a restart would repeat"),
            std::string::npos)
      << again.out;
  EXPECT_EQ(again.out.find("restart 1 of at most 3"), std::string::npos) << again.out;
}

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

#if PIPETRAIN_HAVE_UCX
// UCX's own messages reach the terminal as our lines at their level (a real one: UCX's warning
// about a UCX_ variable it does not know, from each rank), never in UCX's format (" UCX  WARN ").
TEST(Processes, UcxMessagesAreOurLines) {
  const std::string cfg = write_file("ucx_log.json", kMlp);
  const Result r = shell("UCX_PIPETRAIN_NO_SUCH_VARIABLE=1 timeout -s KILL 150 " + std::string(PIPETRAIN_BINARY) +
                         " launch --nproc 2 -- train " + cfg +
                         " --quiet --set runtime.kind=processes --set runtime.transport=ucx 2>&1");
  EXPECT_EQ(r.status, 0) << r.out;
  for (const std::string rank : {"[rank 0] ", "[rank 1] "}) {
    const size_t at = r.out.find(rank + "pipetrain: warning: ucx: unused environment variable");
    EXPECT_NE(at, std::string::npos) << r.out;
    if (at != std::string::npos)
      EXPECT_NE(r.out.substr(at, r.out.find('\n', at) - at).find("UCX_PIPETRAIN_NO_SUCH_VARIABLE"), std::string::npos);
  }
  EXPECT_EQ(r.out.find(" UCX "), std::string::npos) << r.out;
}
#endif

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
