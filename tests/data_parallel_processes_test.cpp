// Data parallelism x pipeline as processes: pipetrain ranks under `pipetrain launch` and by hand
// (torchrun-style variables), each stage's copies in a Gloo group over the rendezvous store.
// Their training equals the threads runtime's (in-process copies), a replica that dies or stops
// mid-reduction fails every rank within the timeout naming it, four ranks across two network
// namespaces equal the threads run, a checkpoint of a sharded run resumes with another D, and a
// tied embedding and head train under a sharded optimizer as one copy does.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/process_helpers.h"
#include "tests/ranks.h"

namespace {

using json = nlohmann::json;
using namespace pipetrain::test;

// Dropout, AdamW with warm-up and gradient clipping: a batch of 12 over 2 copies of 2 stages.
const std::string kConfig = R"({
  "model": {"family": "gpt", "vocab_size": 32, "seq_len": 8, "d_model": 16, "n_heads": 2, "n_layers": 3, "dropout": 0.1},
  "data": {"kind": "synthetic", "batch_size": 12, "samples": 96, "test_samples": 16},
  "pipeline": {"stages": 2, "micro_batches": 3, "schedule": "1f1b", "data_parallel": 2},
  "optimizer": {"kind": "adamw", "lr": 0.003, "weight_decay": 0.01, "warmup_steps": 2, "grad_clip": 1.0},
  "train": {"steps": 5, "seed": 3},
  "runtime": {"timeout_s": 60}
})";

// In float64, so that two copies equal one copy on the whole batch to 1e-10 (only the order of
// the sums differs), and processes equal threads bit for bit.
TEST(DataParallelProcesses, LaunchedRanksEqualThreadsAndOneCopy) {
  const std::string cfg = write_file("dp.json", kConfig);
  for (const char* shard : {"false", "true"}) {
    SCOPED_TRACE(std::string("shard_optimizer ") + shard);
    const std::string set = std::string(" --set runtime.dtype=float64 --set train.shard_optimizer=") + shard;
    const std::string mt = temp("dp_threads.jsonl"), mp = temp("dp_processes.jsonl"), m1 = temp("dp_one.jsonl");
    Result t = run("train " + cfg + " --quiet --metrics " + mt + set);
    ASSERT_EQ(t.status, 0) << t.out;
    Result p = run("launch --nproc 4 -- train " + cfg + " --quiet --metrics " + mp + " --set runtime.kind=processes" + set);
    ASSERT_EQ(p.status, 0) << p.out;
    EXPECT_NE(p.out.find("[rank 0] test accuracy"), std::string::npos) << p.out;
    Result one = run("train " + cfg + " --quiet --metrics " + m1 + " --set runtime.dtype=float64 --set pipeline.data_parallel=1");
    ASSERT_EQ(one.status, 0) << one.out;
    expect_same_steps(read_steps(mt), read_steps(mp), 0, "threads against processes");
    expect_same_steps(read_steps(m1), read_steps(mt), 1e-10, "one copy against two");
  }
  // 2 stages x 2 copies with the stages talking over c10d's Gloo.
  const std::string mt = temp("dp_gloo_threads.jsonl"), mp = temp("dp_gloo_processes.jsonl");
  const std::string set = " --set runtime.dtype=float64 --set runtime.transport=gloo";
  Result t = run("train " + cfg + " --quiet --metrics " + mt + set);
  ASSERT_EQ(t.status, 0) << t.out;
  Result p = run("launch --nproc 4 -- train " + cfg + " --quiet --metrics " + mp + " --set runtime.kind=processes" + set);
  ASSERT_EQ(p.status, 0) << p.out;
  expect_same_steps(read_steps(mt), read_steps(mp), 0, "threads against processes over gloo");
}

// The other launchers: mpirun (OpenMPI's variables) and Slurm's (srun's variables, set by hand
// here: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the node list naming this host) give the same
// training as the threads runtime, bit for bit.
TEST(DataParallelProcesses, MpirunAndSlurmVariablesEqualThreads) {
  const std::string cfg = write_file("dp_launchers.json", kConfig);
  const std::string mt = temp("dp_launchers_threads.jsonl");
  Result t = run("train " + cfg + " --quiet --metrics " + mt);
  ASSERT_EQ(t.status, 0) << t.out;
  const auto threads = read_steps(mt);

  if (shell("command -v mpirun").status == 0) {
    const std::string mp = temp("dp_mpirun.jsonl");
    const std::string port = std::to_string(free_port());
    Result p = shell("MASTER_PORT=" + port + " timeout -s KILL 150 mpirun --allow-run-as-root --oversubscribe -np 4 -x MASTER_PORT " +
                     pipetrain_binary() + " train " + cfg + " --quiet --metrics " + mp + " --set runtime.kind=processes 2>&1");
    ASSERT_EQ(p.status, 0) << p.out;
    expect_same_steps(threads, read_steps(mp), 0, "mpirun");
  } else {
    ADD_FAILURE() << "mpirun is not installed (scripts/setup.sh installs openmpi-bin)";
  }

  const std::string ms = temp("dp_slurm.jsonl");
  const int port = free_port();
  std::vector<Rank> ranks;
  const auto t0 = Clock::now();
  for (int r = 0; r < 4; ++r) {
    std::map<std::string, std::string> env{{"SLURM_PROCID", std::to_string(r)}, {"SLURM_NTASKS", "4"},
                                           {"SLURM_LOCALID", std::to_string(r)}, {"SLURM_NTASKS_PER_NODE", "4"},
                                           {"SLURM_JOB_NODELIST", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)},
                                           {"PIPETRAIN_FAULT", ""}};
    std::vector<std::string> argv{pipetrain_binary(), "train", cfg, "--quiet", "--set", "runtime.kind=processes"};
    if (r == 0) argv.insert(argv.end(), {"--metrics", ms});
    ranks.push_back(spawn(argv, env, temp("dp_slurm_" + std::to_string(r) + ".txt")));
  }
  ASSERT_TRUE(wait_ranks(ranks, {}, t0, 120)) << ranks[0].out();
  for (int r = 0; r < 4; ++r) ASSERT_EQ(ranks[r].status, 0) << "rank " << r << ": " << ranks[r].out();
  expect_same_steps(threads, read_steps(ms), 0, "Slurm's variables");
}

TEST(DataParallelProcesses, WrongWorldSizeIsOneLineError) {
  const std::string cfg = write_file("dp_world.json", kConfig);
  Result r = run("launch --nproc 2 -- train " + cfg + " --quiet --set runtime.kind=processes --set runtime.timeout_s=20");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("pipeline.stages is 2 x pipeline.data_parallel 2 = 4 and the launcher"), std::string::npos) << r.out;
}

// SIGKILL or SIGSTOP of a copy right after it started reducing: every other rank exits within
// the timeout (a killed peer is noticed at once), and names the victim.
TEST(DataParallelProcesses, CopyThatDiesOrStopsMidReductionFailsEveryRank) {
  const std::string cfg = write_file("dp_fault.json", kConfig);
  const double timeout_s = 4;
  for (const char* signal : {"kill", "stop"})
    for (int victim : {1, 2}) {  // copy 1 of stage 0; copy 0 of stage 1
      SCOPED_TRACE(std::string(signal) + " rank " + std::to_string(victim));
      const int port = free_port();
      std::vector<Rank> ranks;
      const auto t0 = Clock::now();
      for (int r = 0; r < 4; ++r) {
        auto env = rank_env(r, 4, port);
        if (r == victim) env["PIPETRAIN_FAULT"] = "pipeline.reduce:" + std::to_string(victim) + ":2:" + signal;
        ranks.push_back(spawn({pipetrain_binary(), "train", cfg, "--quiet", "--steps", "50", "--set", "runtime.kind=processes",
                               "--set", "runtime.timeout_s=" + std::to_string(timeout_s)},
                              env, temp("dp_fault_" + std::to_string(r) + ".txt")));
      }
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
      const bool exited = wait_ranks(ranks, {victim}, t0, fault_s + 3 * timeout_s + 20);
      wait_ranks(ranks, {}, t0, 0);
      EXPECT_TRUE(exited);
      double latest = 0;
      for (int r = 0; r < 4; ++r) {
        if (r == victim) continue;
        const std::string out = ranks[r].out();
        EXPECT_EQ(ranks[r].status, 1) << "rank " << r << ": " << out;
        EXPECT_NE(out.find("rank " + std::to_string(victim)), std::string::npos) << "rank " << r << ": " << out;
        latest = std::max(latest, ranks[r].exited_s - fault_s);
      }
      // The victim's copy partner waits in the reduction (at most the timeout), the others in the
      // step's exchange or behind an abort: two timeouts bound every rank, plus exit time.
      EXPECT_LT(latest, (std::string(signal) == "stop" ? 2 * timeout_s : 0.0) + 6.0);
      std::printf("%s rank %d mid-reduction: the others exited within %.2f s (runtime.timeout_s %.0f)\n", signal,
                  victim, latest, timeout_s);
    }
}

// A sharded run stopped at step 3 and resumed with one copy (threads) equals the run that was
// never stopped; the checkpoint holds the whole optimizer state once.
TEST(DataParallelProcesses, ShardedCheckpointResumesWithAnotherCopyCount) {
  const std::string cfg = write_file("dp_ckpt.json", kConfig);
  const std::string dir = temp("dp_ckpt_dir"), whole = temp("dp_whole.jsonl"), part = temp("dp_part.jsonl");
  shell("rm -rf " + dir);
  const std::string common = " --quiet --set train.shard_optimizer=true";
  Result w = run("train " + cfg + common + " --metrics " + whole);
  ASSERT_EQ(w.status, 0) << w.out;
  Result first = run("launch --nproc 4 -- train " + cfg + common + " --set runtime.kind=processes --checkpoint-dir " + dir +
                     " --until-step 3");
  ASSERT_EQ(first.status, 0) << first.out;
  Result second = run("train " + cfg + common + " --set pipeline.data_parallel=1 --checkpoint-dir " + dir +
                      " --resume --metrics " + part);
  ASSERT_EQ(second.status, 0) << second.out;
  auto a = read_steps(whole), b = read_steps(part);
  ASSERT_EQ(b.size(), 2u);
  for (const auto& [step, j] : b)
    EXPECT_NEAR(j.at("loss").get<double>(), a.at(step).at("loss").get<double>(), 1e-4 * a.at(step).at("loss").get<double>())
        << "step " << step;
}

// The token embedding tied to the head (first and last stage) with a sharded optimizer: each
// copy sums the tie's gradients before its tied stages reduce, and the gradient norm (clipped at
// 0.45 here, which some steps pass) counts the tie once. Processes equal threads bit for bit, two copies equal one to
// 1e-10 (float64), and a run stopped at step 3 and resumed equals the run never stopped.
TEST(DataParallelProcesses, TiedWeightsWithAShardedOptimizer) {
  std::string text = kConfig;
  const std::string layers = "\"n_layers\": 3,";
  text.replace(text.find(layers), layers.size(), layers + " \"tie_embeddings\": true,");
  const std::string cfg = write_file("dp_tied.json", text);
  const std::string set =
      " --quiet --set runtime.dtype=float64 --set train.shard_optimizer=true --set optimizer.grad_clip=0.45";
  const std::string mt = temp("dp_tied_threads.jsonl"), mp = temp("dp_tied_processes.jsonl"),
                    m1 = temp("dp_tied_one.jsonl"), mr = temp("dp_tied_resumed.jsonl"), dir = temp("dp_tied_ckpt");
  shell("rm -rf " + dir);
  Result t = run("train " + cfg + set + " --metrics " + mt);
  ASSERT_EQ(t.status, 0) << t.out;
  Result p = run("launch --nproc 4 -- train " + cfg + set + " --metrics " + mp + " --set runtime.kind=processes");
  ASSERT_EQ(p.status, 0) << p.out;
  Result one = run("train " + cfg + set + " --metrics " + m1 + " --set pipeline.data_parallel=1");
  ASSERT_EQ(one.status, 0) << one.out;
  expect_same_steps(read_steps(mt), read_steps(mp), 0, "threads against processes");
  expect_same_steps(read_steps(m1), read_steps(mt), 1e-10, "one copy against two");
  bool clipped = false;
  for (const auto& [step, j] : read_steps(mt)) clipped = clipped || j.at("grad_norm").get<double>() > 0.45;
  EXPECT_TRUE(clipped) << "no step's norm reached the clip";
  const std::string procs = "launch --nproc 4 -- train " + cfg + set + " --set runtime.kind=processes --checkpoint-dir " + dir;
  Result first = run(procs + " --until-step 3");
  ASSERT_EQ(first.status, 0) << first.out;
  Result second = run(procs + " --resume --metrics " + mr);
  ASSERT_EQ(second.status, 0) << second.out;
  const auto whole = read_steps(mp), resumed = read_steps(mr);
  ASSERT_EQ(resumed.size(), 2u);
  for (const auto& [step, j] : resumed)
    for (const char* key : {"loss", "grad_norm"})
      EXPECT_EQ(j.at(key).get<double>(), whole.at(step).at(key).get<double>()) << "resumed step " << step << " " << key;
}

// Four ranks across two network namespaces (two ranks each, one per stage), over UCX tcp and
// Gloo on the veth pair, equal the threads run.
TEST(DataParallelProcesses, FourRanksInTwoNamespacesEqualThreads) {
  const std::string tag = std::to_string(::getpid() % 100000);
  const std::string a = "pda" + tag, b = "pdb" + tag;
  const int subnet = static_cast<int>(::getpid() % 200) + 20;
  const std::string ip_a = "10.214." + std::to_string(subnet) + ".1", ip_b = "10.214." + std::to_string(subnet) + ".2";
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
  // Bounded wait for both ends of the veth pair to come up.
  for (int i = 0; i < 500; ++i) {
    if (shell("ip -n " + a + " link show va" + tag + " | grep -q 'state UP' && ip -n " + b + " link show vb" + tag +
              " | grep -q 'state UP'").status == 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling the link state, not synchronising
  }
  const std::string cfg = write_file("dp_netns.json", kConfig);
  const std::string mt = temp("dp_netns_threads.jsonl"), mp = temp("dp_netns_processes.jsonl");
  const int port = free_port();
  std::vector<Rank> ranks;
  const auto t0 = Clock::now();
  for (int r = 0; r < 4; ++r) {
    // Ranks 0 and 1 (stage 0's copies) in the first namespace, 2 and 3 in the second: every
    // gradient reduction stays inside a namespace, every activation crosses the veth pair.
    auto env = rank_env(r, 4, port, ip_a);
    env["LOCAL_RANK"] = std::to_string(r % 2);
    env["LOCAL_WORLD_SIZE"] = "2";
    env["UCX_TLS"] = "tcp";
    std::vector<std::string> argv{"ip", "netns", "exec", r < 2 ? a : b, pipetrain_binary(), "train", cfg, "--quiet",
                                  "--set", "runtime.kind=processes", "--set", "runtime.timeout_s=30"};
    if (r == 0) argv.insert(argv.end(), {"--metrics", mp});
    ranks.push_back(spawn(argv, env, temp("dp_netns_" + std::to_string(r) + ".txt")));
  }
  const bool exited = wait_ranks(ranks, {}, t0, 120);
  cleanup();
  Result t = run("train " + cfg + " --quiet --metrics " + mt);
  EXPECT_EQ(t.status, 0) << t.out;
  ASSERT_TRUE(exited) << ranks[0].out() << ranks[2].out();
  for (int r = 0; r < 4; ++r) ASSERT_EQ(ranks[r].status, 0) << "rank " << r << ": " << ranks[r].out();
  expect_same_steps(read_steps(mt), read_steps(mp), 0, "two namespaces");
}

}  // namespace
