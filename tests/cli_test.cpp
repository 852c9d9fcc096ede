// The pipetrain command as a user meets it: bad input is one line on stderr and a non-zero
// exit; --help works on every subcommand; a short run prints progress and accuracy, metrics,
// traces and TensorBoard logs. Planning and benchmarking: cli_plan_test; checkpoints and the
// launcher: cli_resume_test.
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

#include "tests/cli_helpers.h"


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
        // The metrics carry the same peak, in bytes.
        EXPECT_FLOAT_EQ(board["memory/peak_mib/" + std::to_string(stage)][step - 1][1].get<float>(),
                        static_cast<float>(m["device_peak_bytes"][stage].get<double>() / (1 << 20)));
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
  expect_clean_error(run("train /tmp"), "/tmp: is a directory, not a config file");
  expect_clean_error(run("train /dev/zero"), "/dev/zero: not a regular file");
  const std::string broken = write_config("broken.json", "{\n  \"model\": {\"family\": \"mlp\",}\n}");
  expect_clean_error(run("train " + broken), broken + ":2:");
  const std::string typed = write_config("typed.json", R"({"model": {"family": "mlp"}, "data": {"batch_size": "big"}})");
  expect_clean_error(run("train " + typed), "data.batch_size: expected an integer, got string \"big\"");
  // A number out of its range says the rule, not the range of a double in 309 digits.
  const Result negative = run("costs transformer --layers 2 --hidden 8 --seq 8 --heads 2 --vocab 10 --micro-batch 1 "
                              "--device-tflops -1");
  expect_clean_error(negative, "--device-tflops: must be positive, got -1");
  EXPECT_LT(negative.out.size(), 200u) << negative.out;
  expect_clean_error(run("train " + cfg + " --trace-steps 0"), "--trace-steps: must be positive, got 0");
}

// --log-level (and PIPETRAIN_LOG_LEVEL) choose what a run says: warning hides the run's
// description and summary but not its result on stdout; debug adds how the run is laid out.
TEST(Cli, LogLevelChoosesTheMessages) {
  const std::string cfg = write_config("log.json", kSmall);
  Result quiet = run("--log-level warning train " + cfg);
  EXPECT_EQ(quiet.status, 0) << quiet.out;
  EXPECT_EQ(quiet.out.find("pipetrain: mlp on synthetic"), std::string::npos) << quiet.out;
  EXPECT_NE(quiet.out.find("test accuracy"), std::string::npos) << quiet.out;
  Result normal = run("train " + cfg);
  EXPECT_NE(normal.out.find("pipetrain: mlp on synthetic"), std::string::npos) << normal.out;
  EXPECT_EQ(normal.out.find("debug:"), std::string::npos) << normal.out;
  Result debug = shell("PIPETRAIN_LOG_LEVEL=debug " + std::string(PIPETRAIN_BINARY) + " train " + cfg + " 2>&1");
  EXPECT_NE(debug.out.find("pipetrain: debug: 2 stages as threads of this process"), std::string::npos) << debug.out;
  expect_clean_error(run("--log-level loud train " + cfg), "--log-level: loud not in");
}

namespace {
// The timed steps of each run, the last column of bench's table.
std::vector<int> timed_steps(const std::string& out) {
  std::vector<int> steps;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("single-device", 0) == 0 || line.rfind("pipeline  ", 0) == 0)
      steps.push_back(std::stoi(line.substr(line.find_last_of(' ') + 1)));
  return steps;
}
}  // namespace

// `--repeat` steps at least, and more until `--min-time` seconds of them; `--min-time 0`:
// exactly `--repeat`.
TEST(Cli, BenchPrintsBothRunsAndTheRatio) {
  const std::string cfg = write_config("bench.json", kSmall);
  Result r = run("bench " + cfg + " --warmup 1 --repeat 3 --min-time 0");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("single-device"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pipeline / plain"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MiB"), std::string::npos) << r.out;
  EXPECT_EQ(timed_steps(r.out), (std::vector<int>{3, 3, 3})) << r.out;
  // A step of this model takes well under 50 ms, so 0.15 s of them is more than 3; a run that
  // stops at 3 must have spent 0.15 s on them (a machine slowed by other work), so the whole
  // command (three runs) lasted 0.45 s at least.
  const auto t0 = std::chrono::steady_clock::now();
  r = run("bench " + cfg + " --warmup 1 --repeat 3 --min-time 0.15");
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<int> steps = timed_steps(r.out);
  ASSERT_EQ(steps.size(), 3u) << r.out;
  for (int n : steps) {
    EXPECT_GE(n, 3) << r.out;
    if (n == 3) EXPECT_GE(wall, 0.45) << "3 timed steps in a command of " << wall << " s\n" << r.out;
  }
  expect_clean_error(run("bench " + cfg + " --min-time -1"), "--min-time: Value -1 not in range");
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

// A metrics file that cannot be written (a full disk: /dev/full refuses every write) ends the run
// at its first line, naming the file and the reason, instead of going on without it.
TEST(Cli, MetricsOnAFullDiskEndTheRunNamingTheFile) {
  const std::string cfg = write_config("full.json", kSmall);
  const Result r = run("train " + cfg + " --quiet --metrics /dev/full");
  EXPECT_EQ(r.status, 1) << r.out;
  const std::string error = "pipetrain: error: --metrics /dev/full: write failed (No space left on device)\n";
  ASSERT_GE(r.out.size(), error.size()) << r.out;
  EXPECT_EQ(r.out.substr(r.out.size() - error.size()), error) << r.out;  // the run's last word
}

// `costs transformer` writes a cost file for hardware this machine lacks; `simulate` runs every
// schedule on it and prints the step, the bubble and each stage's memory (as JSON with --json),
// and a trace with memory counters; bad input is one line.
