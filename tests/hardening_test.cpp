// Hostile and careless input, as a demanding user or an attacker gives it: every case is a
// one-line error that says what and where (or a warning), never a crash, a hang, a silently
// changed value or lost work. Configs, flags and checkpoint manifests here; stores and peers in
// rendezvous_test, transport_conformance_test and processes_test; the fuzz targets in fuzz/.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/option.h"
#include "common/error.h"
#include "common/json_reader.h"
#include "checkpoint/checkpoint.h"
#include "job/config.h"
#include "tests/process_helpers.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using pipetrain::ConfigError;
using pipetrain::test::Result;
using pipetrain::test::shell;
using Clock = std::chrono::steady_clock;

std::string temp(const std::string& name) {
  return ::testing::TempDir() + "/pipetrain_hard_" + std::to_string(::getpid()) + "_" + name;
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = temp(name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

Result run(const std::string& args) {
  return shell("timeout -s KILL 120 " + std::string(PIPETRAIN_BINARY) + " " + args + " 2>&1");
}

const std::string& kSmall = pipetrain::test::kSmallConfig;
using pipetrain::test::expect_clean_error;

std::string config_error(const json& cfg, const std::vector<std::string>& overrides = {}) {
  try {
    pipetrain::job::parse_config(cfg, "cfg.json", overrides);
  } catch (const ConfigError& e) {
    // Run options by their plain names (the command spells them as flags: cli tests).
    return pipetrain::render_options(e.what(), [](pipetrain::Option o) { return std::string(pipetrain::option_name(o)); });
  }
  return "";
}

json small() { return json::parse(kSmall); }

// A string literal's bytes, NULs and high bytes included.
template <size_t N>
std::string bytes(const char (&s)[N]) {
  return std::string(s, N - 1);
}

// 100,000 nested objects and 10^6 nested arrays were a stack overflow (SIGSEGV) while the
// parsed value was copied; now the parser refuses nesting beyond 64 levels.
TEST(Hardening, DeepNestingIsAnErrorNotACrash) {
  std::string objects, arrays;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  objects += "1";
  for (int i = 0; i < 100000; ++i) objects += "}";
  arrays = std::string(1000000, '[') + std::string(1000000, ']');
  for (const std::string* text : {&objects, &arrays}) {
    try {
      pipetrain::parse_json(*text, "deep.json");
      ADD_FAILURE() << "accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("deep.json: nested deeper than 64 levels"), std::string::npos) << e.what();
    }
  }
  const std::string deep_model = "{\"model\": " + std::string(100, '[') + std::string(100, ']') + "}";
  expect_clean_error(run("train " + write_file("deep.json", objects)), "nested deeper than 64 levels");
  expect_clean_error(run("train " + write_file("deep2.json", arrays)), "nested deeper than 64 levels");
  expect_clean_error(run("train " + write_file("deep3.json", deep_model)), "nested deeper than 64 levels");
  expect_clean_error(run("train " + write_file("ok.json", kSmall) + " --set 'model.x=" + std::string(5000, '[') +
                         std::string(5000, ']') + "'"),
                     "nested deeper than 64 levels");
  // 64 levels are fine.
  EXPECT_NO_THROW(pipetrain::parse_json(std::string(63, '[') + std::string(63, ']'), "ok.json"));
}

// [4294967297, 8] was read as [1, 8]; every integer is now range checked as the wider type.
TEST(Hardening, IntegersAreRangeCheckedNotTruncated) {
  EXPECT_NE(config_error(small(), {"pipeline.balance=[4294967297,8]"})
                .find("override pipeline.balance=[4294967297,8]: pipeline.balance: a stage's layer count must be between 0 "
                      "and 1073741824, found number 4294967297"),
            std::string::npos)
      << config_error(small(), {"pipeline.balance=[4294967297,8]"});
  EXPECT_NE(config_error(small(), {"pipeline.balance=[9223372036854775808,1]"}).find("found number 9223372036854775808"),
            std::string::npos)
      << config_error(small(), {"pipeline.balance=[9223372036854775808,1]"});
  EXPECT_NE(config_error(small(), {"pipeline.balance=[-1,4]"}).find("found number -1"), std::string::npos);
  EXPECT_NE(config_error(small(), {"pipeline.memory_limit=1e300"}).find("from 0 to 2^60"), std::string::npos);
  EXPECT_NE(config_error(small(), {"data.batch_size=9223372036854775808"}).find("value too large"), std::string::npos);
  EXPECT_NE(config_error(small(), {"pipeline.stages=4294967298"}).find("must be between 1 and 4096, got 4294967298"),
            std::string::npos)
      << config_error(small(), {"pipeline.stages=4294967298"});
}

// A 10^6-entry balance list gave a 3 MB error line, and bytes of a bare --set word reached the
// terminal as they were.
TEST(Hardening, LongAndBinaryValuesGiveShortPrintableErrors) {
  json long_balance = small();
  long_balance["pipeline"]["balance"] = std::vector<int>(1000000, 1);
  expect_clean_error(run("train " + write_file("long.json", long_balance.dump())), "entries)");
  // Bytes that are not UTF-8 in a bare --set word (single quotes pass any byte but ').
  const std::string cfg = write_file("ok.json", kSmall);
  expect_clean_error(run("train " + cfg + " --set '" + bytes("data.kind=\xff\xfe\x01x") + "'"), "data.kind");
  expect_clean_error(run("train " + cfg + " --set '" + bytes("train.seed=\xff") + "'"), "train.seed");
  expect_clean_error(run("train " + write_file("binary.json", bytes("{\"model\": \xff\xfe\x01}"))), "invalid JSON");
}

// --steps replaced train.steps before the file was checked ("abc" and -7 ran), and a value
// out of range blamed a --set the user never typed.
TEST(Hardening, StepsFlagIsCheckedAndTheFileToo) {
  const std::string cfg = write_file("steps.json", kSmall);
  expect_clean_error(run("train " + cfg + " --steps 1e20"), "--steps 1e20: expected a whole number of steps from 0 to");
  expect_clean_error(run("train " + cfg + " --steps abc"), "--steps abc");
  expect_clean_error(run("train " + cfg + " --steps -7"), "--steps -7");
  expect_clean_error(run("train " + cfg + " --steps 99999999999999"), "--steps 99999999999999");
  json bad = small();
  bad["train"]["steps"] = "abc";
  expect_clean_error(run("train " + write_file("bad_steps.json", bad.dump()) + " --steps 1"),
                     "bad_steps.json: train.steps: expected an integer, got string \"abc\"");
  bad["train"]["steps"] = -7;
  expect_clean_error(run("train " + write_file("neg_steps.json", bad.dump()) + " --steps 1"),
                     "neg_steps.json: train.steps: must be between 0 and");
  const Result ok = run("train " + cfg + " --steps 1 --quiet");
  EXPECT_EQ(ok.status, 0) << ok.out;
}

// The fault-injection variable of the process tests is checked like any input; a fault at a
// point the run reaches kills it there.
TEST(Hardening, FaultVariableIsChecked) {
  const std::string cfg = write_file("fault.json", kSmall);
  const std::string bin = " timeout -s KILL 120 " + std::string(PIPETRAIN_BINARY) + " train " + cfg + " --quiet 2>&1";
  expect_clean_error(shell("PIPETRAIN_FAULT=bogus" + bin), "PIPETRAIN_FAULT=bogus: four or five fields");
  expect_clean_error(shell("PIPETRAIN_FAULT=pipeline.stage:0:1:kill" + bin), "unknown point pipeline.stage");
  expect_clean_error(shell("PIPETRAIN_FAULT=pipeline.step:x:1:kill" + bin), "RANK, STEP and ATTEMPT must be numbers");
  expect_clean_error(shell("PIPETRAIN_FAULT=pipeline.step:1:2:kill:-1" + bin), "ATTEMPT must be an attempt number");
  expect_clean_error(shell("PIPETRAIN_FAULT=pipeline.step:0:1:explode" + bin), "unknown action explode");
  EXPECT_EQ(shell("PIPETRAIN_FAULT=pipeline.step:1:2:kill" + bin).status, 128 + 9);
  EXPECT_EQ(shell("PIPETRAIN_FAULT=pipeline.step:1:100000:kill" + bin).status, 0);  // a step never reached
  EXPECT_EQ(shell("PIPETRAIN_FAULT=pipeline.step:1:2:kill:1" + bin).status, 0);  // another attempt's
  EXPECT_EQ(shell("PIPETRAIN_RESTART=1 PIPETRAIN_FAULT=pipeline.step:0:1:stop:0,pipeline.step:1:2:kill:1" + bin).status,
            128 + 9);
}

// --until-step without a directory exited 0 having saved nothing; an unusable directory was
// found only at the first save, after the training time was spent.
TEST(Hardening, CheckpointDirectoryProblemsAreFoundAtStart) {
  const std::string cfg = write_file("ckpt.json", kSmall);
  expect_clean_error(run("train " + cfg + " --until-step 2"), "--until-step: stops the run with a checkpoint");
  const std::string file = write_file("a_file", "x");
  const auto t0 = Clock::now();
  expect_clean_error(run("train " + cfg + " --steps 1000000 --checkpoint-dir " + file + "/sub"),
                     "--checkpoint-dir: " + file + "/sub: cannot create the directory");
  expect_clean_error(run("train " + cfg + " --steps 1000000 --checkpoint-dir " + file),
                     "--checkpoint-dir: " + file + ": cannot create the directory");
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 30.0);  // 10^6 steps would take hours
  json in_config = small();
  in_config["train"]["checkpoint_dir"] = file + "/sub";
  expect_clean_error(run("train " + write_file("ckpt2.json", in_config.dump())),
                     "ckpt2.json: train.checkpoint_dir: " + file + "/sub: cannot create the directory");
}

// A checkpoint whose manifest was edited: step, pipeline_step and batches drive the resume.
class EditedManifest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp("manifest");
    fs::remove_all(dir_);
    cfg_ = write_file("manifest.json", kSmall);
    const Result r = run("train " + cfg_ + " --quiet --checkpoint-dir " + dir_ + " --until-step 2");
    ASSERT_EQ(r.status, 0) << r.out;
    manifest_ = dir_ + "/step-00000002/manifest.json";
    std::ifstream in(manifest_);
    original_ = json::parse(in);
  }
  // Writes the manifest with `edit` applied; `rehash`: as a careful forger would, with the
  // manifest hash recomputed.
  void write(const std::function<void(json&)>& edit, bool rehash) {
    json m = original_;
    edit(m);
    if (rehash) {
      json without = m;
      without.erase("manifest_hash");
      m["manifest_hash"] = pipetrain::checkpoint::identity_hash(without);
    }
    std::ofstream(manifest_, std::ios::trunc) << m.dump(2);
  }
  Result resume() { return run("train " + cfg_ + " --quiet --checkpoint-dir " + dir_ + " --resume"); }

  std::string dir_, cfg_, manifest_;
  json original_;
};

TEST_F(EditedManifest, AnyEditedFieldIsRefused) {
  for (const char* key : {"step", "pipeline_step", "batches", "stages", "seed", "schedule"}) {
    SCOPED_TRACE(key);
    write([&](json& m) { m[key] = m[key].is_number() ? json(m[key].get<int64_t>() + 1) : json("1f1b"); }, false);
    expect_clean_error(resume(), "the manifest does not match its hash (it was altered)", 1);
  }
  write([](json& m) { m["step"] = -1; }, false);
  expect_clean_error(resume(), "it was altered", 1);
}

TEST_F(EditedManifest, FieldsThatDisagreeAreRefusedEvenWithTheHashRecomputed) {
  write([](json& m) { m["step"] = -1; }, true);
  expect_clean_error(resume(), "step -1 is not a step a run can have saved", 1);
  write([](json& m) { m["pipeline_step"] = 7; }, true);
  expect_clean_error(resume(), "disagree (batches and passes must be step x train.accumulate = 2 x 1)", 1);
  write([](json& m) {
    m["step"] = 1;
    m["batches"] = 1;
    m["pipeline_step"] = 1;
  },
        true);
  expect_clean_error(resume(), "holds step 1 but its directory is step-00000002", 1);
  write([](json& m) { m["stages"] = 5; }, true);
  expect_clean_error(resume(), "shards cannot come from 5 stages", 1);
  write([](json&) {}, true);  // untouched, the hash recomputed: still a good checkpoint
  const Result r = resume();
  EXPECT_EQ(r.status, 0) << r.out;
}

TEST_F(EditedManifest, GarbageIsReportedPrintably) {
  std::ofstream(manifest_, std::ios::trunc | std::ios::binary) << bytes("\xff\xfe{\"step\": \x80\x81");
  expect_clean_error(resume(), "manifest.json: not valid JSON", 1);
}

// runtime.intra_op_threads 1024 ran 20x slower without a word.
TEST(Hardening, OversubscribedThreadsWarn) {
  const Result r = run("train " + write_file("threads.json", kSmall) +
                       " --quiet --steps 1 --set runtime.intra_op_threads=64");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("pipetrain: warning: 64 intra-op threads per stage x 2 stages on this host = 128 threads on"),
            std::string::npos)
      << r.out;
  const Result quiet = run("train " + write_file("threads1.json", kSmall) +
                           " --quiet --steps 1 --set runtime.intra_op_threads=1");
  EXPECT_EQ(quiet.out.find("warning"), std::string::npos) << quiet.out;
  // The default thread count never warns, even with more stages than cores.
  const Result many = run("train " + write_file("threads4.json", kSmall) + " --quiet --steps 1 --set pipeline.stages=3");
  EXPECT_EQ(many.out.find("warning"), std::string::npos) << many.out;
}

// Whether `pid` is gone: no such process, or a zombie nobody reaped yet.
bool gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const auto close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'Z';
}

// The launcher's children (its ranks) once `count` have started, within 30 s.
std::vector<pid_t> children_of(pid_t launcher, size_t count) {
  std::vector<pid_t> ranks;
  const auto t0 = Clock::now();
  while (ranks.size() < count && Clock::now() - t0 < std::chrono::seconds(30)) {
    ranks.clear();
    std::istringstream children(shell("cat /proc/" + std::to_string(launcher) + "/task/*/children 2>/dev/null").out);
    for (pid_t p; children >> p;) ranks.push_back(p);
    if (ranks.size() < count) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return ranks;
}

// SIGKILL of `pipetrain launch` left its ranks running, orphaned; they now get SIGTERM when the
// launcher dies (and stop after their step).
TEST(Hardening, RanksDieWithTheirLauncher) {
  const std::string cfg = write_file("orphans.json", kSmall);
  const pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, STDOUT_FILENO);
    ::dup2(null, STDERR_FILENO);
    ::execl(PIPETRAIN_BINARY, PIPETRAIN_BINARY, "launch", "--nproc", "2", "--", "train", cfg.c_str(), "--steps",
            "100000000", "--quiet", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const std::vector<pid_t> ranks = children_of(launcher, 2);
  ASSERT_EQ(ranks.size(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the ranks are training
  ::kill(launcher, SIGKILL);
  ::waitpid(launcher, nullptr, 0);
  const auto killed = Clock::now();
  bool all_gone = false;
  while (!all_gone && Clock::now() - killed < std::chrono::seconds(30)) {
    all_gone = gone(ranks[0]) && gone(ranks[1]);
    if (!all_gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!all_gone)
    for (pid_t p : ranks) ::kill(p, SIGKILL);
  EXPECT_TRUE(all_gone) << "ranks still running 30 s after their launcher was killed";
}

// A rank stopped by SIGSTOP: its peer times out naming it, and the launcher, which saw the stop,
// names it too (it used to name only the rank that timed out), then ends the stopped rank.
TEST(Hardening, LauncherNamesAStoppedRank) {
  const std::string cfg = write_file("stopped.json", kSmall);
  const std::string out = temp("stopped_launch.txt"), metrics = temp("stopped_metrics.jsonl");
  const pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::execl(PIPETRAIN_BINARY, PIPETRAIN_BINARY, "launch", "--nproc", "2", "--grace", "3", "--", "train", cfg.c_str(),
            "--steps", "100000000", "--quiet", "--metrics", metrics.c_str(), "--set", "runtime.kind=processes", "--set",
            "runtime.timeout_s=3", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const std::vector<pid_t> ranks = children_of(launcher, 2);
  ASSERT_EQ(ranks.size(), 2u);
  // Rank 1 by its environment (there once the rank has started the program: a child seen just
  // after the fork still shows the launcher's); stopped once training runs (rank 0 has written a step).
  pid_t rank1 = -1;
  const auto seen = Clock::now();
  while (rank1 < 0 && Clock::now() - seen < std::chrono::seconds(30)) {
    for (pid_t p : ranks)
      if (shell("tr '\\0' '\\n' < /proc/" + std::to_string(p) + "/environ | grep -qx RANK=1").status == 0) rank1 = p;
    if (rank1 < 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GT(rank1, 0);
  const auto t0 = Clock::now();
  while (shell("test -s " + metrics).status != 0 && Clock::now() - t0 < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ::kill(rank1, SIGSTOP);
  int status = 0;
  bool exited = false;
  const auto stopped = Clock::now();
  while (!exited && Clock::now() - stopped < std::chrono::seconds(40)) {
    exited = ::waitpid(launcher, &status, WNOHANG) == launcher;
    if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!exited) {
    ::kill(launcher, SIGKILL);
    ::kill(rank1, SIGKILL);
    ::waitpid(launcher, nullptr, 0);
  }
  ASSERT_TRUE(exited) << shell("cat " + out).out;
  const std::string text = shell("cat " + out).out;
  EXPECT_NE(WEXITSTATUS(status), 0) << text;
  EXPECT_NE(text.find("pipetrain launch: warning: rank 1 was stopped by SIGSTOP"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 0 exited with status 1; rank 1 is stopped (SIGSTOP), which is likely why"),
            std::string::npos)
      << text;
  EXPECT_TRUE(gone(rank1)) << text;
}

}  // namespace
