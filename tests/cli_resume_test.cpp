// Checkpoints, resume, eval, export and the launcher as a user drives them.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/cli_helpers.h"


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

// --resume where no complete checkpoint is yet (a run killed before or during its first save, its
// cut-short save left as a .partial folder) starts afresh, says so in one line, and saves.
TEST(Cli, ResumeWithoutACompleteCheckpointStartsAfresh) {
  const std::string cfg = write_config("lm.json", kLm);
  const std::string dir = fresh_dir("afresh");
  std::filesystem::create_directories(dir + "/.step-00000002.partial");
  std::ofstream(dir + "/.step-00000002.partial/stage-0.pt") << "cut short";
  const Result r = run("train " + cfg + " --quiet --resume --checkpoint-dir " + dir + " --until-step 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("pipetrain: note: --resume: " + dir + " holds no complete checkpoint yet; starting afresh\n"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(exists(dir + "/step-00000002/manifest.json")) << r.out;
  // The next restart resumes from that save.
  const Result again = run("train " + cfg + " --quiet --resume --checkpoint-dir " + dir + " --until-step 4");
  ASSERT_EQ(again.status, 0) << again.out;
  EXPECT_EQ(again.out.find("starting afresh"), std::string::npos) << again.out;
  EXPECT_TRUE(exists(dir + "/step-00000004/manifest.json")) << again.out;
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
