// Stages across processes on a GPU (ctest label gpu; each test skips, saying why, without one):
// two pipetrain processes on the one GPU of the machine, over each transport, train the tied GPT
// with each schedule, and every step's loss and gradient norm equal those of the same config run
// as threads on that GPU (which the Cuda equivalence grid holds equal to one device) to 1e-10
// in float64.
//
// NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): each rank here gets its own
// NCCL_HOSTID, so that NCCL takes them for two hosts and moves the data over sockets on the
// loopback interface (NCCL_SOCKET_IFNAME=lo, NCCL_IB_DISABLE=1). That is a test-only arrangement
// for one-GPU machines, unsupported by NCCL and slow; on two GPUs nothing of it is needed.
// UCX carries device memory where it was built with CUDA (UCX_CUDA=1 in --version), the host's
// otherwise; Gloo goes through pinned host memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "stages/accelerator.h"
#include "tests/cli_helpers.h"

namespace {

using json = nlohmann::json;
using pipetrain::test::expect_same_steps;
using pipetrain::test::free_port;
using pipetrain::test::read_steps;

#define REQUIRE_GPU()                                                                                 \
  do {                                                                                                \
    const auto acc_ = pipetrain::stages::accelerator_info();                                          \
    if (acc_.gpus == 0) GTEST_SKIP() << "no CUDA device: " << acc_.no_gpu_reason;                      \
  } while (0)

// The tied GPT (the head's weight tied to the embedding, first and last rank), dropout on, in
// float64, so that the two runs differ in nothing but where their stages run (1e-10 apart).
std::string config(const std::string& schedule) {
  const bool chunked = schedule == "interleaved-1f1b" || schedule == "looped-bfs" || schedule == "zb-v" ||
                       schedule == "dualpipev";
  json c = {{"model", {{"family", "gpt"}, {"vocab_size", 32}, {"seq_len", 8}, {"d_model", 16}, {"n_heads", 2},
                       {"n_layers", chunked ? 6 : 3}, {"dropout", 0.1}, {"tie_embeddings", true}}},
            {"data", {{"kind", "synthetic"}, {"batch_size", 8}, {"samples", 32}, {"test_samples", 8}}},
            {"pipeline", {{"stages", 2}, {"micro_batches", 4}, {"schedule", schedule}, {"devices", "cuda:0"}}},
            {"optimizer", {{"kind", "adamw"}, {"lr", 0.003}}},
            {"train", {{"steps", 3}, {"seed", 7}}},
            {"runtime", {{"timeout_s", 120}, {"dtype", "float64"}}}};
  if (chunked) c["pipeline"]["chunks"] = 2;
  return c.dump();
}

// Two ranks of `cfg` on this GPU, started by hand as a launcher would (RANK, WORLD_SIZE, ...),
// each with its own NCCL_HOSTID; each killed after 100 s, before ctest ends the test (its
// TIMEOUT 120) and would leave them running. Returns the shell's result (both ranks'
// output); rank 0 writes `metrics`.
Result two_ranks(const std::string& cfg, const std::string& transport, const std::string& metrics) {
  const int port = free_port();
  std::string script = "set -u; pids=''; ";
  for (int r = 0; r < 2; ++r)
    script += "RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) +
              " WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
              " NCCL_HOSTID=pipetrain-test-host-" + std::to_string(r) +
              " NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 timeout -s KILL 100 " + PIPETRAIN_BINARY + " train " + cfg +
              " --quiet --set runtime.kind=processes --set runtime.transport=" + transport +
              (r == 0 ? " --metrics " + metrics : "") + " 2>&1 & pids=\"$pids $!\"; ";
  script += "st=0; for p in $pids; do wait $p || st=1; done; exit $st";
  return shell("bash -c '" + script + "'");
}

// The same config as threads on the GPU, run once per schedule for every transport: ctest runs
// each test in a process of its own, so the run is kept in a file named after ctest's process.
std::map<int, json> threads_run(const std::string& schedule) {
  const std::string kept = ::testing::TempDir() + "/pipetrain_gpu2_threads_" + schedule + "_" +
                           std::to_string(::getppid()) + ".jsonl";
  auto steps = read_steps(kept);
  if (steps.size() == 3) return steps;
  // Named after this process: tests of the same schedule may run at once (ctest -j). The kept
  // file appears whole (a rename), never half written, to a test reading it meanwhile.
  const std::string own = std::to_string(::getpid());
  const std::string cfg = write_config("gpu2_threads_" + schedule + "_" + own + ".json", config(schedule));
  Result t = run("train " + cfg + " --quiet --metrics " + cfg + ".jsonl");
  EXPECT_EQ(t.status, 0) << t.out;
  std::filesystem::copy_file(cfg + ".jsonl", kept + "." + own, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::rename(kept + "." + own, kept);
  return read_steps(kept);
}

// NCCL, whose ordering rules are the ones that can deadlock, runs every schedule; UCX and Gloo a
// schedule of each family (fill-drain, 1F1B, split backward, interleaved, V). One test each.
std::vector<std::pair<std::string, std::string>> cases() {
  std::vector<std::pair<std::string, std::string>> v;
  for (const std::string s : {"gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zb-auto", "zb-v",
                              "dualpipev"})
    v.emplace_back("nccl", s);
  for (const std::string t : {"ucx", "gloo"})
    for (const std::string s : {"gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v"}) v.emplace_back(t, s);
  return v;
}

class TwoProcessesOneGpu : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(TwoProcessesOneGpu, StepsEqualThreadsOnTheGpu) {
  REQUIRE_GPU();
  const auto& [transport, schedule] = GetParam();
  const std::string cfg = write_config("gpu2_" + transport + "_" + schedule + ".json", config(schedule));
  const std::string processes = cfg + ".processes.jsonl";
  Result p = two_ranks(cfg, transport, processes);
  ASSERT_EQ(p.status, 0) << p.out;
  const auto a = threads_run(schedule);
  ASSERT_EQ(a.size(), 3u);
  expect_same_steps(read_steps(processes), a, 1e-10, transport + ", " + schedule);
}

INSTANTIATE_TEST_SUITE_P(Transports, TwoProcessesOneGpu, ::testing::ValuesIn(cases()), [](const auto& info) {
  std::string name = info.param.first + "_" + info.param.second;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
});

}  // namespace
