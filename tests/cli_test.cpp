// The pipetrain command as a user meets it: bad input is one line on stderr and a non-zero
// exit; --help works on every subcommand; a short run prints progress and accuracy.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/process_helpers.h"

namespace {

using pipetrain::test::Result;
using pipetrain::test::shell;

Result run(const std::string& args) { return shell(std::string(PIPETRAIN_BINARY) + " " + args + " 2>&1"); }

std::string write_config(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/pipetrain_cli_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

const std::string& kSmall = pipetrain::test::kSmallConfig;
using pipetrain::test::expect_clean_error;

}  // namespace

TEST(Cli, HelpOnEverySubcommand) {
  for (const char* sub : {"", "train ", "eval ", "generate ", "export ", "launch ", "bench ", "plan ", "partition ",
                          "simulate ", "costs ", "costs transformer "}) {
    Result r = run(std::string(sub) + "--help");
    EXPECT_EQ(r.status, 0) << sub;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << r.out;
  }
}

TEST(Cli, TrainsAndWritesMetrics) {
  const std::string cfg = write_config("ok.json", kSmall);
  const std::string metrics = cfg + ".jsonl";
  Result r = run("train " + cfg + " --metrics " + metrics + " --set train.seed=3");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("step 3/3 | loss"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("test accuracy"), std::string::npos) << r.out;
  std::ifstream in(metrics);
  std::string line;
  int steps = 0;
  while (std::getline(in, line))
    if (line.find("\"step\"") != std::string::npos && line.find("\"samples_per_s\"") != std::string::npos &&
        line.find("\"loss\"") != std::string::npos && line.find("\"lr\"") != std::string::npos &&
        line.find("\"grad_norm\"") != std::string::npos)
      ++steps;
  EXPECT_EQ(steps, 3);
}

namespace {
// The losses of a metrics file, by step.
std::vector<double> metric_losses(const std::string& path) {
  std::vector<double> losses;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss") && !j.contains("event")) losses.push_back(j["loss"].get<double>());
  }
  return losses;
}
}  // namespace

// An epoch of 20 samples in batches of 8 ends with a batch of 4, fewer than the 8 micro-batches:
// it is trained, as 4 micro-batches (said once), and every step, that one included, equals one
// device's step (one stage, one micro-batch) in float64; with data.drop_last the epoch has two
// batches and the third step starts the next epoch.
TEST(Cli, AnEpochsShortLastBatchIsTrained) {
  const std::string cfg = write_config("short.json", R"({
    "model": {"family": "mlp", "in": 8, "width": 8, "layers": 3, "out": 4, "dropout": 0.2},
    "data": {"kind": "synthetic", "batch_size": 8, "samples": 20, "test_samples": 8},
    "pipeline": {"stages": 2, "micro_batches": 8, "schedule": "1f1b"},
    "optimizer": {"kind": "adam", "lr": 0.01},
    "runtime": {"dtype": "float64"},
    "train": {"steps": 5}
  })");
  const std::string pipe = cfg + ".pipe.jsonl", one = cfg + ".one.jsonl", drop = cfg + ".drop.jsonl";
  Result r = run("train " + cfg + " --metrics " + pipe);
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string note = "note: step 3 trains an epoch's last batch, of 4 samples, fewer than its 8 micro-batches need: it runs as 4";
  EXPECT_NE(r.out.find(note), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("note: step 5"), std::string::npos) << "said once: " << r.out;
  r = run("train " + cfg + " --metrics " + one + " --set pipeline.stages=1 --set pipeline.micro_batches=1");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto a = metric_losses(pipe), b = metric_losses(one);
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-10 * b[i]) << "step " << i + 1;
  r = run("train " + cfg + " --metrics " + drop + " --set data.drop_last=true");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("an epoch's last batch"), std::string::npos) << r.out;
  const auto d = metric_losses(drop);
  ASSERT_EQ(d.size(), 5u);
  EXPECT_EQ(d[0], a[0]);
  EXPECT_EQ(d[1], a[1]);
  EXPECT_NE(d[2], a[2]);  // the next epoch's first batch instead of the short one
  for (const auto& f : {pipe, one, drop}) std::remove(f.c_str());
}

// `train --tensorboard DIR` writes an event file that TensorBoard's own reader (the `tensorboard`
// package from PyPI) reads back: every step's loss, learning rate, gradient norm, samples/s and
// stage busy times equal the metrics file's (as float32), the test results are there, and
// each device's peak memory is at least its parameters. With one process per stage, rank 0
// writes the log and it holds every device's memory.
TEST(Cli, TensorBoardLogMatchesTheMetrics) {
  const std::string py = PIPETRAIN_PYTHON;
  if (pipetrain::test::shell(py + " -c 'import tensorboard' 2>&1").status != 0)
    GTEST_SKIP() << py << " has no tensorboard package (scripts/setup.sh installs it)";
  const std::string cfg = write_config("board.json", R"({
    "model": {"family": "mlp", "in": 8, "width": 16, "layers": 3, "out": 4},
    "data": {"kind": "synthetic", "batch_size": 8, "samples": 64, "test_samples": 16},
    "pipeline": {"stages": 2, "micro_batches": 2},
    "optimizer": {"kind": "adam", "lr": 0.01, "warmup_steps": 2},
    "train": {"steps": 5, "eval_every": 2}
  })");
  const std::string dir = ::testing::TempDir() + "/pipetrain_board_" + std::to_string(::getpid());
  const std::string reader = dir + "/read.py";
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  std::ofstream(reader) << R"(import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(json.dumps({tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}))
)";
  auto read = [&](const std::string& logdir) {
    const Result r = pipetrain::test::shell(py + " " + reader + " " + logdir + " 2>/dev/null");
    EXPECT_EQ(r.status, 0) << r.out;
    return nlohmann::json::parse(r.out);
  };
  for (const bool processes : {false, true}) {
    SCOPED_TRACE(processes ? "processes" : "threads");
    const std::string logdir = dir + (processes ? "/processes" : "/threads"), metrics = logdir + ".jsonl";
    const std::string args = "train " + cfg + " --quiet --tensorboard " + logdir + " --metrics " + metrics;
    Result r = run(processes ? "launch --nproc 2 -- " + args + " --set runtime.kind=processes" : args);
    ASSERT_EQ(r.status, 0) << r.out;
    const auto board = read(logdir);
    std::ifstream in(metrics);
    std::string line;
    int steps = 0, evals = 0;
    while (std::getline(in, line)) {
      const auto m = nlohmann::json::parse(line);
      if (m.contains("event")) {
        const int step = m["step"];
        for (const auto& [tag, key] : {std::pair{"test/loss", "test_loss"}, std::pair{"test/accuracy", "test_accuracy"}}) {
          bool found = false;
          for (const auto& e : board[tag])
            if (e[0] == step) {
              found = true;
              EXPECT_FLOAT_EQ(e[1].get<float>(), m[key].get<float>()) << tag;
            }
          EXPECT_TRUE(found) << tag << " at step " << step;
        }
        ++evals;
        continue;
      }
      const int step = m["step"];
      ASSERT_LT(static_cast<size_t>(step - 1), board["train/loss"].size());
      for (const auto& [tag, key] : {std::pair{"train/loss", "loss"}, std::pair{"train/lr", "lr"},
                                     std::pair{"train/grad_norm", "grad_norm"}, std::pair{"train/samples_per_s", "samples_per_s"}}) {
        const auto& e = board[tag][step - 1];
        EXPECT_EQ(e[0], step) << tag;
        EXPECT_FLOAT_EQ(e[1].get<float>(), m[key].get<float>()) << tag << " at step " << step;
      }
      for (int stage = 0; stage < 2; ++stage) {
        EXPECT_FLOAT_EQ(board["stages/busy_ms/" + std::to_string(stage)][step - 1][1].get<float>(),
                        m["stage_busy_ms"][stage].get<float>());
        // At least the stage's parameters: two Linear(16x16 or 8x16) layers of float32 and more.
        EXPECT_GT(board["memory/peak_mib/" + std::to_string(stage)][step - 1][1].get<double>(), 0.0);
      }
      const double bubble = board["stages/bubble"][step - 1][1];
      EXPECT_GE(bubble, 0.0);
      EXPECT_LT(bubble, 1.0);
      ++steps;
    }
    EXPECT_EQ(steps, 5);
    EXPECT_EQ(evals, 3);  // after steps 2 and 4, and the final test
  }
  expect_clean_error(run("train " + cfg + " --tensorboard /proc/pipetrain_cannot_be_here"), "--tensorboard: tensorboard directory /proc/pipetrain_cannot_be_here: cannot create it");
  std::system(("rm -rf " + dir).c_str());
}

// Accumulation, warm-up with cosine decay and clipping from the config: the metrics show the
// learning rate of each step and a clipped run still trains.
TEST(Cli, TrainingControls) {
  const std::string cfg = write_config("controls.json", kSmall);
  const std::string metrics = cfg + ".controls.jsonl";
  Result r = run("train " + cfg + " --quiet --steps 5 --metrics " + metrics +
                 " --set train.accumulate=2 --set optimizer.warmup_steps=2 --set optimizer.lr_schedule=cosine"
                 " --set optimizer.grad_clip=0.5 --set optimizer.lr=0.1");
  ASSERT_EQ(r.status, 0) << r.out;
  std::ifstream in(metrics);
  std::string line;
  std::vector<double> lrs;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("lr")) {
      lrs.push_back(j["lr"].get<double>());
      EXPECT_GT(j["grad_norm"].get<double>(), 0.0) << line;
    }
  }
  // Warm-up over 2 steps, then cosine from lr to 0 over the remaining 3: progress 0, 1/3, 2/3.
  const std::vector<double> want{0.05, 0.1, 0.1, 0.075, 0.025};
  ASSERT_EQ(lrs.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(lrs[i], want[i], 1e-12) << i;
}

TEST(Cli, StepsFlagOverridesConfig) {
  const std::string cfg = write_config("steps.json", kSmall);
  Result r = run("train " + cfg + " --steps 1");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("step 1/1"), std::string::npos) << r.out;
}

TEST(Cli, BadInputIsOneLineAndNonZero) {
  const std::string cfg = write_config("base.json", kSmall);
  expect_clean_error(run("train " + cfg + " --set pipeline.stagse=4"), "did you mean 'pipeline.stages'");
  expect_clean_error(run("train " + cfg + " --set pipeline.stages=9"), "9 stages but the model has only 4 layers");
  expect_clean_error(run("train " + cfg + " --set pipeline.micro_batches=0"), "pipeline.micro_batches");
  expect_clean_error(run("train " + cfg + " --set pipeline.micro_batches=100"), "exceed data.batch_size");
  expect_clean_error(run("train " + cfg + " --set pipeline.balance=[1,1]"), "sums to 2");
  expect_clean_error(run("train " + cfg + " --set data.kind=fashion-mnist --set data.path=/nope"),
                        "dataset-fashion-mnist", 1);
  expect_clean_error(run("train /nonexistent.json"), "/nonexistent.json: cannot open the config file");
  const std::string broken = write_config("broken.json", "{\n  \"model\": {\"family\": \"mlp\",}\n}");
  expect_clean_error(run("train " + broken), broken + ":2:");
  const std::string typed = write_config("typed.json", R"({"model": {"family": "mlp"}, "data": {"batch_size": "big"}})");
  expect_clean_error(run("train " + typed), "data.batch_size: expected an integer, got string \"big\"");
}

TEST(Cli, BenchPrintsBothRunsAndTheRatio) {
  const std::string cfg = write_config("bench.json", kSmall);
  Result r = run("bench " + cfg + " --warmup 1 --repeat 3");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("single-device"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pipeline / plain"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MiB"), std::string::npos) << r.out;
}

TEST(Cli, NonFiniteLossStopsTheRunNamingTheStep) {
  const std::string cfg = write_config("diverge.json", kSmall);
  const std::string metrics = cfg + ".jsonl";
  Result r = run("train " + cfg + " --quiet --set optimizer.lr=1e6 --set train.steps=50 --metrics " + metrics);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("pipetrain: error: step "), std::string::npos) << r.out;
  // Whichever turns non-finite first, the message says what and where.
  EXPECT_TRUE(r.out.find("the loss is") != std::string::npos ||
              r.out.find(": the gradient is not finite") != std::string::npos)
      << r.out;
  // The steps before the failure are kept in the metrics file.
  std::ifstream in(metrics);
  std::string first;
  EXPECT_TRUE(std::getline(in, first));
  EXPECT_NE(first.find("\"step\":1"), std::string::npos) << first;
}

// `train --trace` writes the measured timeline of the second step as a Chrome trace: every
// action of the schedule on every stage, with the recompute spans of recomputed micro-batches.
TEST(Cli, TrainWritesAChromeTrace) {
  const std::string cfg = write_config("trace.json", kSmall);
  const std::string trace = ::testing::TempDir() + "/pipetrain_cli_trace_" + std::to_string(::getpid()) + ".json";
  Result r = run("train " + cfg + " --quiet --trace " + trace + " --set pipeline.schedule=1f1b");
  ASSERT_EQ(r.status, 0) << r.out;
  std::ifstream in(trace);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.rfind("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", 0), 0u) << text.substr(0, 200);
  for (const char* needle : {"\"name\":\"forward 0\"", "\"name\":\"backward 1\"", "\"cat\":\"recompute\"",
                             "\"cat\":\"send_activation\"", "\"cat\":\"recv_grad\"", "\"step\":1",
                             "measured: 1f1b, 2 stages, 2 micro-batches"})
    EXPECT_NE(text.find(needle), std::string::npos) << needle;
  EXPECT_EQ(text.find("\"step\":0"), std::string::npos) << "the first (warm-up) step is not traced";
  r = run("train " + cfg + " --quiet --trace /nonexistent/dir/t.json");
  expect_clean_error(r, "--trace /nonexistent/dir/t.json: cannot open for writing");
}

// `costs transformer` writes a cost file for hardware this machine lacks; `simulate` runs every
// schedule on it and prints the step, the bubble and each stage's memory (as JSON with --json),
// and a trace with memory counters; bad input is one line.
TEST(Cli, CostsTransformerAndSimulate) {
  const std::string dir = ::testing::TempDir() + "/pipetrain_cli_sim_" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  const std::string costs = dir + "/gpt.json";
  Result r = run("costs transformer --layers 16 --hidden 1024 --seq 1024 --heads 16 --vocab 32000 --micro-batch 2 "
                 "--device-tflops 100 --efficiency 0.5 --bandwidth 25 --out " + costs);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("wrote 19 layers to " + costs), std::string::npos) << r.out;
  // One block: F = 24bsh^2 + 4bs^2h FLOP at 50 TFLOP/s.
  const double b = 2, sq = 1024, h = 1024;
  const double block_f = (24 * b * sq * h * h + 4 * b * sq * sq * h) / 50e12 * 1e3;
  std::ifstream in(costs);
  const auto file = nlohmann::json::parse(in);
  EXPECT_NEAR(file["layers"][1]["forward_ms"].get<double>(), block_f, 1e-9 * block_f);
  EXPECT_DOUBLE_EQ(file["link"]["bandwidth_gb_s"].get<double>(), 25);
  double step_1f1b = 0;
  for (const char* kind : {"1f1b", "zb-h1", "zb-h2", "looped-bfs", "zb-v", "dualpipev", "zb-auto"}) {
    r = run("simulate --costs " + costs + " --stages 4 --micro-batches 8 --json --schedule " + kind);
    ASSERT_EQ(r.status, 0) << kind << ": " << r.out;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["schedule"], kind);
    EXPECT_GT(j["step_ms"].get<double>(), 0) << kind;
    EXPECT_GT(j["bubble"].get<double>(), 0) << kind;
    EXPECT_LT(j["bubble"].get<double>(), 1) << kind;
    ASSERT_EQ(j["peak_memory_bytes"].size(), 4u) << kind;
    ASSERT_EQ(j["per_stage"].size(), 4u) << kind;
    EXPECT_GT(j["per_stage"][0]["peak_activation_bytes"].get<double>(), 0) << kind;
    if (std::string(kind) == "1f1b") step_1f1b = j["step_ms"].get<double>();
    else if (std::string(kind) != "looped-bfs") EXPECT_LT(j["step_ms"].get<double>(), step_1f1b) << kind;
  }
  r = run("simulate --costs " + costs + " --stages 2 --micro-batches 4 --schedule zb-v --trace " + dir + "/t.json");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* needle : {"simulate: zb-v, 2 stages x 2 chunks, 4 micro-batches", "from the cost file", "peak activations", "step "})
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
  std::ifstream trace(dir + "/t.json");
  const auto t = nlohmann::json::parse(trace);
  int counters = 0;
  for (const auto& e : t["traceEvents"]) counters += e["ph"] == "C";
  EXPECT_GT(counters, 8);
  // A cost file without B and W: the split is assumed and said.
  const std::string plain = dir + "/plain.json";
  std::ofstream(plain) << R"([{"forward_ms": 1, "backward_ms": 2, "param_bytes": 4, "activation_bytes": 8},
                              {"forward_ms": 1, "backward_ms": 2, "param_bytes": 4, "activation_bytes": 8}])";
  r = run("simulate --costs " + plain + " --stages 2 --micro-batches 4 --schedule zb-h1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("B and W are half of backward_ms each"), std::string::npos) << r.out;
  expect_clean_error(run("simulate --costs " + plain + " --stages 3 --micro-batches 4"), "2 layers cannot fill 3 virtual stages");
  expect_clean_error(run("simulate --costs " + plain + " --stages 2 --micro-batches 3 --schedule dualpipev"),
                     "dualpipev needs at least twice as many micro-batches as stages");
  std::ofstream(plain) << R"([{"forward_ms": 1, "backward_ms": 2, "backward_input_ms": 1, "param_bytes": 4, "activation_bytes": 8}])";
  expect_clean_error(run("simulate --costs " + plain + " --stages 1 --micro-batches 4"),
                     "entry 0 (layer 0): backward_input_ms and backward_weight_ms go together");
  std::ofstream(plain) << R"({"layers": [{"forward_ms": 1, "backward_ms": 2, "param_bytes": 4, "activation_bytes": 8}], "link": {"bandwidth_gb_s": -1}})";
  expect_clean_error(run("simulate --costs " + plain + " --stages 1 --micro-batches 4"), "link: \"bandwidth_gb_s\" must be a number");
  expect_clean_error(run("costs transformer --layers 2 --hidden 10 --seq 8 --heads 3 --vocab 5 --micro-batch 1"),
                     "--hidden (10) must be a multiple of --heads (3)");
  std::system(("rm -rf " + dir).c_str());
}

// `plan --auto` searches, lists the fastest plans and writes the winner as a config that trains
// as written; a memory limit nothing fits names the least that would; `train --auto` plans first.
TEST(Cli, AutoPlan) {
  const std::string cfg = write_config("auto.json", kSmall);
  const std::string out = ::testing::TempDir() + "/pipetrain_cli_auto_" + std::to_string(::getpid()) + ".json";
  Result r = run("plan " + cfg + " --auto --devices 2 --top 4 --write-config " + out);
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* needle : {"plans simulated in", "rank", "samples/s", "peak/device", "chosen: ", "wrote " })
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
  std::ifstream in(out);
  const auto chosen = nlohmann::json::parse(in);
  ASSERT_TRUE(chosen["pipeline"]["balance"].is_array()) << chosen.dump();
  r = run("train " + out + " --steps 2 --quiet");
  EXPECT_EQ(r.status, 0) << r.out;
  expect_clean_error(run("plan " + cfg + " --auto --devices 2 --memory-limit 1000"), "the smallest needs ");
  expect_clean_error(run("plan " + cfg + " --auto --devices 2 --speeds 1,2,3"), "--speeds: 3 speeds for 2 devices");
  r = run("train " + cfg + " --auto --steps 2 --quiet");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("chosen: "), std::string::npos) << r.out;
  std::remove(out.c_str());
}

// Data parallelism in plan, bench and the auto-planner: plan charges each stage's reduction on
// the measured link and counts the sharded optimizer's memory; bench times copies side by side
// with the plain loop and reports the reduction and the optimizer state; plan --auto searches
// copies and sharding and writes a winner that trains.
TEST(Cli, DataParallelInPlanBenchAndAutoPlan) {
  const std::string cfg = write_config("dp.json", kSmall);
  const std::string adam = " --set optimizer.kind=adam --set pipeline.data_parallel=2 --json --repeat 1";
  Result whole = run("plan " + cfg + adam);
  Result sharded = run("plan " + cfg + adam + " --set train.shard_optimizer=true");
  ASSERT_EQ(whole.status, 0) << whole.out;
  ASSERT_EQ(sharded.status, 0) << sharded.out;
  const auto w = nlohmann::json::parse(whole.out), z = nlohmann::json::parse(sharded.out);
  EXPECT_EQ(w["data_parallel"]["copies"], 2);
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"})
    EXPECT_GT(w["data_parallel"][op]["gb_s"].get<double>(), 0.0) << op;
  EXPECT_FALSE(w["data_parallel"]["sharded_optimizer"].get<bool>());
  EXPECT_TRUE(z["data_parallel"]["sharded_optimizer"].get<bool>());
  for (size_t s = 0; s < w["stages"].size(); ++s) {
    EXPECT_GT(w["stages"][s]["reduce_ms"].get<double>(), 0.0) << whole.out;
    // Adam: 1 + 1 + 2 = 4 bytes per parameter byte besides it, sharded 1 + 1 + 3/2 = 3.5.
    EXPECT_LT(z["stages"][s]["peak_memory_bytes"].get<int64_t>(), w["stages"][s]["peak_memory_bytes"].get<int64_t>());
  }
  Result text = run("plan " + cfg + " --repeat 1 --set pipeline.data_parallel=2");
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_NE(text.out.find("2 stages x 2 data-parallel copies"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("data parallel: 2 copies; all-reduce "), std::string::npos) << text.out;

  const std::string out = ::testing::TempDir() + "/pipetrain_cli_dp_" + std::to_string(::getpid()) + ".jsonl";
  std::remove(out.c_str());
  Result r = run("bench " + cfg + " --stages 1 --data-parallel 1,2 --warmup 0 --repeat 2 --json " + out);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("[2/2] K=1 D=2 M=2"), std::string::npos) << r.out;
  std::ifstream in(out);
  std::string line;
  std::map<int, nlohmann::json> by_copies;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    by_copies[j["data_parallel"].get<int>()] = j;
  }
  ASSERT_EQ(by_copies.size(), 2u);
  EXPECT_FALSE(by_copies[1].contains("reduce_ms"));
  EXPECT_GT(by_copies[2]["reduce_ms"].get<double>(), 0.0) << by_copies[2].dump();
  EXPECT_GE(by_copies[2]["exposed_reduce_ms"].get<double>(), 0.0);
  EXPECT_GT(by_copies[2]["pipeline_samples_per_s"].get<double>(), 0.0);
  r = run("bench " + cfg + " --set pipeline.stages=1 --set pipeline.data_parallel=2 --warmup 0 --repeat 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("data parallel: the longest stage's reduction "), std::string::npos) << r.out;

  const std::string chosen = ::testing::TempDir() + "/pipetrain_cli_dp_" + std::to_string(::getpid()) + ".json";
  r = run("plan " + cfg + " --auto --devices 2 --json --write-config " + chosen);
  ASSERT_EQ(r.status, 0) << r.out;
  int copies = 0, shards = 0;
  std::istringstream plans(r.out);
  while (std::getline(plans, line))
    if (line.rfind("{", 0) == 0) {
      const auto j = nlohmann::json::parse(line);
      EXPECT_LE(j["stages"].get<int>() * j["data_parallel"].get<int>(), 2) << line;
      copies += j["data_parallel"].get<int>() == 2;
      shards += j["shard_optimizer"].get<bool>();
    }
  EXPECT_GT(copies, 0) << r.out;
  EXPECT_GT(shards, 0) << r.out;
  r = run("train " + chosen + " --steps 2 --quiet");
  EXPECT_EQ(r.status, 0) << r.out;
  std::remove(out.c_str());
  std::remove(chosen.c_str());
}

// plan --auto on a cost file plans for hardware this machine lacks, without building the model:
// a 7B GPT (28 GB of float32 weights, more than this machine holds) on 8 devices of 80 GB, two
// of them at half speed with a slower link; the winner fits, names the devices' speeds, and
// the transfers and reductions are costed on the file's link. A file without micro_batch cannot
// be scaled to other micro-batch sizes: one line says so.
TEST(Cli, AutoPlanFromACostFile) {
  const std::string dir = ::testing::TempDir() + "/pipetrain_cli_autocosts_" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  const std::string costs = dir + "/gpt7b.json";
  Result r = run("costs transformer --layers 32 --hidden 4096 --seq 4096 --heads 32 --vocab 50257 --micro-batch 1 "
                 "--device-tflops 989 --efficiency 0.45 --bandwidth 50 --out " + costs);
  ASSERT_EQ(r.status, 0) << r.out;
  nlohmann::json file;
  {
    std::ifstream in(costs);
    file = nlohmann::json::parse(in);
  }
  EXPECT_EQ(file["micro_batch"], 1);
  file["devices"] = nlohmann::json::array();
  for (int d = 0; d < 8; ++d)
    file["devices"].push_back(d < 6 ? nlohmann::json{{"speed", 1.0}} : nlohmann::json{{"speed", 0.5}, {"bandwidth_gb_s", 10}});
  std::ofstream(costs) << file.dump();
  const std::string cfg = write_config("gpt7b.json", R"({
    "model": {"family": "gpt", "vocab_size": 50257, "seq_len": 4096, "d_model": 4096, "n_heads": 32, "n_layers": 32},
    "data": {"kind": "synthetic", "batch_size": 32},
    "pipeline": {"stages": 8},
    "optimizer": {"kind": "adamw"}
  })");
  const std::string chosen = dir + "/chosen.json";
  r = run("plan " + cfg + " --auto --costs " + costs + " --memory-limit 80000000000 --top 3 --write-config " + chosen);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("chosen: "), std::string::npos) << r.out;
  std::ifstream in(chosen);
  const auto c = nlohmann::json::parse(in);
  const int K = c["pipeline"]["stages"], D = c["pipeline"]["data_parallel"];
  EXPECT_LE(K * D, 8) << c.dump();
  EXPECT_GE(K, 2) << "28 GB of weights with Adam's state do not fit one 80 GB device: " << c.dump();
  ASSERT_TRUE(c["pipeline"]["speeds"].is_array()) << c.dump();
  EXPECT_EQ(c["pipeline"]["speeds"].size(), static_cast<size_t>(K));
  r = run("plan " + cfg + " --auto --costs " + costs + " --memory-limit 80000000000 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  std::istringstream plans(r.out);
  std::string line;
  int n = 0;
  while (std::getline(plans, line)) {
    const auto j = nlohmann::json::parse(line);
    for (double peak : j["peak_bytes"]) EXPECT_LE(peak, 80e9) << line;
    EXPECT_EQ(j["precision"], "fp32") << line;
    ++n;
  }
  EXPECT_GT(n, 10);
  expect_clean_error(run("plan " + cfg + " --auto --costs " + costs + " --devices 4"), "--devices: 4 devices, but ");
  file.erase("micro_batch");
  std::ofstream(costs) << file.dump();
  expect_clean_error(run("plan " + cfg + " --auto --costs " + costs), "the file gives no \"micro_batch\"");
  std::system(("rm -rf " + dir).c_str());
}

// `plan` profiles, partitions and simulates; --compare lists every schedule; --json is JSON;
// --save-costs writes a cost file that `partition` reads back.
TEST(Cli, PlanAndPartition) {
  const std::string cfg = write_config("plan.json", kSmall);
  const std::string costs = ::testing::TempDir() + "/pipetrain_cli_costs_" + std::to_string(::getpid()) + ".json";
  Result r = run("plan " + cfg + " --compare --repeat 1 --save-costs " + costs + " --set pipeline.balance=time");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* needle : {"balance time", "stage chunk layers", "predicted step", "gpipe", "1f1b", "zb-h1",
                             "interleaved-1f1b"})
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
  r = run("plan " + cfg + " --json --repeat 1");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* needle : {"\"balance\": [", "\"predicted\": {", "\"step_ms\"", "\"peak_memory_bytes\""})
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;

  r = run("partition --costs " + costs + " --stages 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.rfind("{\"balance\":[", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("\"bottleneck\":"), std::string::npos) << r.out;
  expect_clean_error(run("partition --costs " + costs + " --stages 9"), "9 stages");
  expect_clean_error(run("partition --costs " + costs + " --stages 2 --memory-limit 10"), "memory limit");
  expect_clean_error(run("partition --costs " + costs + " --stages 2 --speeds 1"), "--speeds: 1 speeds for 2 stages");
  const std::string bad = write_config("bad_costs.json", R"([{"name": "a", "forward_ms": -1, "backward_ms": 1, "param_bytes": 0, "activation_bytes": 0}])");
  expect_clean_error(run("partition --costs " + bad + " --stages 1"), "entry 0 (a): \"forward_ms\" must be a number from 0 to 8.64e+07, got number -1");
  expect_clean_error(run("partition --costs /nonexistent.json --stages 1"), "/nonexistent.json: cannot open the cost file");
}

// `bench` with lists sweeps every combination and writes one JSON object per combination with
// the fields the plots and tables need; a combination the config cannot run is reported as
// skipped with the reason, not dropped.
TEST(Cli, BenchSweepWritesJsonLines) {
  const std::string cfg = write_config("sweep.json", kSmall);
  const std::string out = ::testing::TempDir() + "/pipetrain_cli_sweep_" + std::to_string(::getpid()) + ".jsonl";
  std::remove(out.c_str());
  Result r = run("bench " + cfg + " --stages 1,2 --micro-batches 2,3 --schedule gpipe,interleaved-1f1b --recompute never "
                 "--warmup 0 --repeat 1 --json " + out);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("[8/8] K=2 M=3 interleaved-1f1b never: skipped"), std::string::npos) << r.out;
  std::ifstream in(out);
  std::string line;
  int lines = 0, skipped = 0;
  while (std::getline(in, line)) {
    ++lines;
    const auto j = nlohmann::json::parse(line);
    if (j.contains("skipped")) {
      ++skipped;
      EXPECT_NE(j["skipped"].get<std::string>().find("multiple of 2"), std::string::npos) << line;
      continue;
    }
    for (const char* key : {"stages", "micro_batches", "schedule", "recompute", "baseline_samples_per_s",
                            "baseline_all_cores_samples_per_s", "pipeline_samples_per_s", "speedup", "bubble_measured",
                            "bubble_predicted", "peak_memory_bytes", "peak_tensor_bytes", "machine", "config"})
      EXPECT_TRUE(j.contains(key)) << key << " missing in " << line;
    EXPECT_GT(j["pipeline_samples_per_s"].get<double>(), 0.0);
    EXPECT_NEAR(j["speedup"].get<double>(),
                j["pipeline_samples_per_s"].get<double>() / j["baseline_samples_per_s"].get<double>(), 1e-9);
    EXPECT_EQ(j["config"]["model"]["family"], "mlp");
  }
  EXPECT_EQ(lines, 8);
  EXPECT_EQ(skipped, 1);
  r = run("bench " + cfg + " --schedule pipedream");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("pipedream"), std::string::npos) << r.out;
  // The sweep flag's former name says where it went.
  expect_clean_error(run("bench " + cfg + " --checkpoint never"), "bench --checkpoint: renamed --recompute");
}

// `bench --precision fp32,bf16` times both precisions of a combination back to back and compares
// the second with the first; fp16 is reported as skipped on the CPU, with the reason; `plan`
// names the precision it profiled in; a bf16 run trains and writes its loss scale (1).
TEST(Cli, BenchComparesPrecisionsAndPlanNamesIt) {
  const std::string cfg = write_config("precision.json", kSmall);
  const std::string out = ::testing::TempDir() + "/pipetrain_cli_precision_" + std::to_string(::getpid()) + ".jsonl";
  std::remove(out.c_str());
  Result r = run("bench " + cfg + " --precision fp32,bf16,fp16 --warmup 0 --repeat 1 --json " + out);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("[2/3] K=2 M=2 gpipe except_last bf16: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("vs fp32: plain "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fp16: skipped: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fp16 is for GPU stages only"), std::string::npos) << r.out;
  std::ifstream in(out);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["precision"], "fp32");
  EXPECT_EQ(lines[1]["precision"], "bf16");
  EXPECT_GT(lines[1]["plain_speedup_vs_fp32"].get<double>(), 0.0);
  EXPECT_GT(lines[1]["pipeline_speedup_vs_fp32"].get<double>(), 0.0);
  EXPECT_TRUE(lines[2].contains("skipped"));
  r = run("plan " + cfg + " --set train.precision=bf16 --repeat 1");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("precision bf16"), std::string::npos) << r.out;
  const std::string metrics = ::testing::TempDir() + "/pipetrain_cli_bf16_" + std::to_string(::getpid()) + ".jsonl";
  r = run("train " + cfg + " --set train.precision=bf16 --set train.steps=3 --quiet --metrics " + metrics);
  EXPECT_EQ(r.status, 0) << r.out;
  std::ifstream m(metrics);
  std::string first;
  ASSERT_TRUE(std::getline(m, first));
  EXPECT_EQ(nlohmann::json::parse(first)["loss_scale"], 1.0) << first;
}

// With train.on_nonfinite=skip the run goes on, says which steps it skipped, and ends normally.
TEST(Cli, NonFiniteStepsCanBeSkipped) {
  const std::string cfg = write_config("skip.json", kSmall);
  Result r = run("train " + cfg + " --set optimizer.lr=1e6 --set train.steps=30 --set train.on_nonfinite=skip");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("; update skipped"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("updates skipped"), std::string::npos) << r.out;
}

// Checkpoints, resume, eval and export as a user drives them.
namespace {

const std::string kLm = R"({
  "model": {"family": "gpt", "vocab_size": 16, "seq_len": 8, "d_model": 16, "n_heads": 2, "n_layers": 2, "dropout": 0.1},
  "data": {"kind": "synthetic", "batch_size": 8, "samples": 64, "test_samples": 16},
  "pipeline": {"stages": 2, "micro_batches": 2},
  "optimizer": {"kind": "adamw", "lr": 0.01, "lr_schedule": "cosine", "warmup_steps": 2},
  "train": {"steps": 6, "seed": 1, "checkpoint_every": 2}
})";

std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/pipetrain_cli_" + std::to_string(::getpid()) + "_" + name;
  std::system(("rm -rf '" + d + "'").c_str());
  return d;
}

// Loss of each step in a metrics file (later lines win: a resumed run appends).
std::map<int, double> step_losses(const std::string& metrics) {
  std::map<int, double> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out[j["step"].get<int>()] = j["loss"].get<double>();
  }
  return out;
}

// The "test accuracy ..., test loss ... on N samples" part of the last output line.
std::string test_line(const std::string& out) {
  const size_t a = out.rfind("test accuracy");
  if (a == std::string::npos) return "";
  return out.substr(a, out.find(" samples", a) - a);
}

bool exists(const std::string& path) { return std::ifstream(path).good(); }

// The uninterrupted run of kLm (with periodic evaluation, which must not disturb training).
struct Reference {
  std::map<int, double> losses;
  std::string test, dir;
};
const Reference& reference() {
  static Reference r = [] {
    Reference ref;
    const std::string cfg = write_config("lm.json", kLm);
    ref.dir = fresh_dir("ref");
    const std::string metrics = ref.dir + ".jsonl";
    Result out = run("train " + cfg + " --quiet --checkpoint-dir " + ref.dir + " --metrics " + metrics +
                     " --set train.eval_every=2");
    EXPECT_EQ(out.status, 0) << out.out;
    ref.losses = step_losses(metrics);
    ref.test = test_line(out.out);
    int evals = 0;
    std::ifstream in(metrics);
    std::string line;
    while (std::getline(in, line))
      if (line.find("\"event\":\"eval\"") != std::string::npos) ++evals;
    EXPECT_EQ(evals, 2);  // after steps 2 and 4; step 6 is the final test
    return ref;
  }();
  return r;
}

}  // namespace

TEST(Cli, ResumeReproducesTheUninterruptedRun) {
  const Reference& ref = reference();
  ASSERT_EQ(ref.losses.size(), 6u);
  const std::string cfg = write_config("lm.json", kLm);
  const std::string dir = fresh_dir("resume"), metrics = dir + ".jsonl";
  Result first = run("train " + cfg + " --quiet --checkpoint-dir " + dir + " --metrics " + metrics + " --until-step 3");
  ASSERT_EQ(first.status, 0) << first.out;
  EXPECT_NE(first.out.find("stopped at step 3"), std::string::npos) << first.out;
  EXPECT_TRUE(exists(dir + "/step-00000002/manifest.json"));
  EXPECT_TRUE(exists(dir + "/step-00000003/manifest.json"));
  Result second = run("train " + cfg + " --checkpoint-dir " + dir + " --metrics " + metrics + " --resume");
  ASSERT_EQ(second.status, 0) << second.out;
  EXPECT_NE(second.out.find("resuming from " + dir + "/step-00000003 (step 3 of 6"), std::string::npos) << second.out;
  const auto losses = step_losses(metrics);
  ASSERT_EQ(losses.size(), 6u);
  for (const auto& [step, loss] : ref.losses) EXPECT_EQ(losses.at(step), loss) << "step " << step;  // bit for bit
  EXPECT_EQ(test_line(second.out), ref.test);

  // Evaluating the final checkpoint gives the run's own test result.
  Result eval = run("eval " + cfg + " --checkpoint " + dir);
  ASSERT_EQ(eval.status, 0) << eval.out;
  EXPECT_EQ(test_line(eval.out), ref.test) << eval.out;
  EXPECT_NE(eval.out.find("step-00000006, step 6"), std::string::npos) << eval.out;

  Result ex = run("export " + dir + " " + dir + "/model.pt");
  ASSERT_EQ(ex.status, 0) << ex.out;
  EXPECT_NE(ex.out.find("exported"), std::string::npos) << ex.out;
  EXPECT_TRUE(exists(dir + "/model.pt"));
}

TEST(Cli, ResumeOnAnotherStageCount) {
  const Reference& ref = reference();
  const std::string cfg = write_config("lm.json", kLm);
  const std::string dir = fresh_dir("restage"), metrics = dir + ".jsonl";
  ASSERT_EQ(run("train " + cfg + " --quiet --checkpoint-dir " + dir + " --until-step 2").status, 0);
  Result r = run("train " + cfg + " --quiet --checkpoint-dir " + dir + " --metrics " + metrics +
                 " --resume --set pipeline.stages=4 --set pipeline.schedule=1f1b");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto losses = step_losses(metrics);
  ASSERT_EQ(losses.size(), 4u);
  for (int s = 3; s <= 6; ++s) EXPECT_NEAR(losses.at(s), ref.losses.at(s), 1e-5) << "step " << s;
}

// A kill in the middle of writing the step-4 checkpoint leaves step 2 as the latest; resuming
// from it ends where the uninterrupted run ends.
TEST(Cli, KillDuringSaveKeepsThePreviousCheckpoint) {
  const Reference& ref = reference();
  const std::string cfg = write_config("lm.json", kLm);
  const std::string dir2 = fresh_dir("kill");
  EXPECT_NE(shell("PIPETRAIN_FAULT=checkpoint.shard:0:4:kill " + std::string(PIPETRAIN_BINARY) + " train " + cfg +
                  " --quiet --checkpoint-dir " + dir2 + " 2>&1").status, 0);
  EXPECT_TRUE(exists(dir2 + "/step-00000002/manifest.json"));
  EXPECT_TRUE(exists(dir2 + "/.step-00000004.partial/stage-0.pt"));
  EXPECT_FALSE(exists(dir2 + "/.step-00000004.partial/manifest.json"));
  EXPECT_FALSE(exists(dir2 + "/step-00000004/manifest.json"));
  Result resumed = run("train " + cfg + " --checkpoint-dir " + dir2 + " --resume");
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("step-00000002 (step 2 of 6"), std::string::npos) << resumed.out;
  EXPECT_EQ(test_line(resumed.out), ref.test);
  EXPECT_FALSE(exists(dir2 + "/.step-00000004.partial/stage-0.pt"));  // cleared by the next save
}

TEST(Cli, DamagedOrMisusedCheckpointsAreRefused) {
  const std::string cfg = write_config("lm.json", kLm);
  const std::string dir = fresh_dir("refuse");
  ASSERT_EQ(run("train " + cfg + " --quiet --checkpoint-dir " + dir + " --until-step 2").status, 0);
  expect_clean_error(run("train " + cfg + " --quiet --checkpoint-dir " + dir),
                        "already holds checkpoints (latest " + dir + "/step-00000002); pass --resume");
  expect_clean_error(run("train " + cfg + " --quiet --resume"), "--resume: no checkpoint directory");
  expect_clean_error(run("train " + cfg + " --quiet --resume --checkpoint-dir " + dir + " --set model.d_model=32"),
                        "was written by a different run: model.d_model: 16 in the checkpoint, 32 in the config", 1);
  expect_clean_error(run("eval " + cfg + " --checkpoint " + dir + "/nothing"), "no such file or directory", 1);
  std::ofstream(dir + "/step-00000002/manifest.json", std::ios::trunc) << "{\"format\": ";
  expect_clean_error(run("train " + cfg + " --quiet --resume --checkpoint-dir " + dir),
                        "step-00000002/manifest.json: not valid JSON", 1);
  expect_clean_error(run("eval " + cfg + " --checkpoint " + dir), "not valid JSON", 1);
  expect_clean_error(run("export " + dir + " " + dir + "/x.pt"), "not valid JSON", 1);
  EXPECT_FALSE(exists(dir + "/x.pt"));
  const std::string no_dir = write_config("every.json", kLm);
  expect_clean_error(run("train " + no_dir + " --quiet"), "train.checkpoint_every: checkpoints every 2 steps need a directory");
}

// SIGTERM in the middle of a long run: the step in progress finishes, a checkpoint is written,
// the exit status says which signal, and the run resumes from there.
TEST(Cli, SigtermSavesACheckpointAndStops) {
  const std::string cfg = write_config("lm.json", kLm);
  const std::string dir = fresh_dir("sigterm"), metrics = dir + ".jsonl";
  // The shell waits (bounded: 60 s) for the first metrics line, then sends SIGTERM.
  const std::string cmd = std::string(PIPETRAIN_BINARY) + " train " + cfg + " --quiet --checkpoint-dir " + dir +
                          " --metrics " + metrics + " --steps 100000 --set train.checkpoint_every=0 & pid=$!; "
                          "for i in $(seq 600); do [ -s " + metrics + " ] && break; sleep 0.1; done; "
                          "kill -TERM $pid; wait $pid; echo \"status=$?\"";
  const std::string out = shell(cmd).out;
  EXPECT_NE(out.find("status=143"), std::string::npos) << out;
  const auto losses = step_losses(metrics);
  ASSERT_FALSE(losses.empty());
  const int last = losses.rbegin()->first;
  char name[32];
  std::snprintf(name, sizeof name, "/step-%08d/manifest.json", last);
  EXPECT_TRUE(exists(dir + name)) << out;
  Result resumed = run("train " + cfg + " --checkpoint-dir " + dir + " --resume --steps " + std::to_string(last + 1));
  EXPECT_EQ(resumed.status, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("(step " + std::to_string(last) + " of " + std::to_string(last + 1)), std::string::npos)
      << resumed.out;
}

// `pipetrain launch`: the torchrun-style environment, prefixed output, a failed rank stopping the
// others, and signals forwarded to every rank.
TEST(Cli, LaunchSetsTheEnvironmentAndPrefixesOutput) {
  Result r = run("launch --nproc 3 -- sh -c 'echo \"r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK a=$MASTER_ADDR p=$MASTER_PORT\"'");
  ASSERT_EQ(r.status, 0) << r.out;
  std::string port;
  for (int i = 0; i < 3; ++i) {
    const std::string want = "[rank " + std::to_string(i) + "] r=" + std::to_string(i) + " w=3 l=" + std::to_string(i) + " a=127.0.0.1 p=";
    const size_t at = r.out.find(want);
    ASSERT_NE(at, std::string::npos) << r.out;
    const std::string p = r.out.substr(at + want.size(), r.out.find('\n', at) - at - want.size());
    EXPECT_GT(std::stoi(p), 0);
    if (i == 0) port = p;
    EXPECT_EQ(p, port);  // one master port for all ranks
  }
  // A pipetrain subcommand runs the pipetrain binary itself.
  const std::string cfg = write_config("launch.json", kSmall);
  r = run("launch --nproc 2 -- train " + cfg + " --steps 1 --quiet");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("[rank 0] test accuracy"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 1] test accuracy"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 0] pipetrain: note: started as one of 2 ranks (torchrun) with runtime.kind threads"),
            std::string::npos)
      << r.out;
  expect_clean_error(run("launch --nproc 0 -- train " + cfg), "--nproc");
  expect_clean_error(run("train " + cfg + " --until-step -1"), "--until-step");
}

TEST(Cli, LaunchStopsTheOtherRanksWhenOneFails) {
  // Ranks 0 and 2 would run for a minute; rank 1 fails at once.
  const auto t0 = std::chrono::steady_clock::now();
  Result r = run("launch --nproc 3 --grace 5 -- sh -c 'if [ \"$RANK\" = 1 ]; then echo failing; exit 3; fi; exec sleep 60'");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_NE(r.out.find("[rank 1] failing"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1 exited with status 3; stopping the other ranks"), std::string::npos) << r.out;
  EXPECT_LT(s, 45.0) << r.out;  // the others were stopped rather than waited for
}

TEST(Cli, LaunchForwardsSigtermToEveryRank) {
  const std::string out = ::testing::TempDir() + "/pipetrain_cli_" + std::to_string(::getpid()) + "_launch_sig.txt";
  std::remove(out.c_str());
  // Each rank says it is ready, then waits for SIGTERM; the shell polls (bounded) for both
  // ready lines before sending SIGTERM to the launcher.
  const std::string cmd = std::string(PIPETRAIN_BINARY) +
                          " launch --nproc 2 -- sh -c 'trap \"echo got-term; exit 7\" TERM; echo ready; "
                          "for i in $(seq 600); do sleep 0.1; done' > " + out + " 2>&1 & pid=$!; "
                          "for i in $(seq 600); do [ \"$(grep -c ready " + out + ")\" = 2 ] && break; sleep 0.1; done; "
                          "kill -TERM $pid; wait $pid; echo \"status=$?\"; cat " + out;
  const std::string text = shell(cmd).out;
  EXPECT_NE(text.find("status=7"), std::string::npos) << text;
  EXPECT_NE(text.find("[rank 0] got-term"), std::string::npos) << text;
  EXPECT_NE(text.find("[rank 1] got-term"), std::string::npos) << text;
  EXPECT_NE(text.find("SIGTERM; forwarding it to every rank"), std::string::npos) << text;
}
