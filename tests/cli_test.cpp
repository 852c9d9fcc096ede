// The pipetrain command as a user meets it: bad input is one line on stderr and a non-zero
// exit; --help works on every subcommand; a short run prints progress and accuracy.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>

namespace {

struct Result {
  int status;
  std::string out;  // stdout and stderr together
};

Result run(const std::string& args) {
  const std::string cmd = std::string(PIPETRAIN_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

std::string write_config(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/pipetrain_cli_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

const std::string kSmall = R"({
  "model": {"family": "mlp", "in": 8, "width": 8, "layers": 3, "out": 4},
  "data": {"kind": "synthetic", "batch_size": 8, "samples": 64, "test_samples": 16},
  "pipeline": {"stages": 2, "micro_batches": 2},
  "train": {"steps": 3}
})";

// One line: the message and the newline that ends it.
void expect_one_line_error(const Result& r, const std::string& needle, int status = 2) {
  EXPECT_EQ(r.status, status) << r.out;
  EXPECT_EQ(r.out.rfind("pipetrain: error: ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << r.out;
}

}  // namespace

TEST(Cli, HelpOnEverySubcommand) {
  for (const char* sub : {"", "train ", "bench "}) {
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
        line.find("\"loss\"") != std::string::npos)
      ++steps;
  EXPECT_EQ(steps, 3);
}

TEST(Cli, StepsFlagOverridesConfig) {
  const std::string cfg = write_config("steps.json", kSmall);
  Result r = run("train " + cfg + " --steps 1");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("step 1/1"), std::string::npos) << r.out;
}

TEST(Cli, BadInputIsOneLineAndNonZero) {
  const std::string cfg = write_config("base.json", kSmall);
  expect_one_line_error(run("train " + cfg + " --set pipeline.stagse=4"), "did you mean 'pipeline.stages'");
  expect_one_line_error(run("train " + cfg + " --set pipeline.stages=9"), "9 stages but the model has only 4 layers");
  expect_one_line_error(run("train " + cfg + " --set pipeline.micro_batches=0"), "pipeline.micro_batches");
  expect_one_line_error(run("train " + cfg + " --set pipeline.micro_batches=100"), "exceed data.batch_size");
  expect_one_line_error(run("train " + cfg + " --set pipeline.balance=[1,1]"), "sums to 2");
  expect_one_line_error(run("train " + cfg + " --set data.kind=fashion-mnist --set data.path=/nope"),
                        "dataset-fashion-mnist", 1);
  expect_one_line_error(run("train /nonexistent.json"), "/nonexistent.json: cannot open the config file");
  const std::string broken = write_config("broken.json", "{\n  \"model\": {\"family\": \"mlp\",}\n}");
  expect_one_line_error(run("train " + broken), broken + ":2:");
  const std::string typed = write_config("typed.json", R"({"model": {"family": "mlp"}, "data": {"batch_size": "big"}})");
  expect_one_line_error(run("train " + typed), "data.batch_size: expected an integer, got string \"big\"");
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
  EXPECT_NE(r.out.find("the loss is"), std::string::npos) << r.out;
  // The steps before the failure are kept in the metrics file.
  std::ifstream in(metrics);
  std::string first;
  EXPECT_TRUE(std::getline(in, first));
  EXPECT_NE(first.find("\"step\":1"), std::string::npos) << first;
}
