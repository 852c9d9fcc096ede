// Helpers of the suites that start pipetrain ranks as processes (processes_test,
// hostile_peer_test): temporary files, ranks started by hand with their own environment and
// output file, bounded waits for their exit, and a rank's launcher variables.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/process_helpers.h"

namespace pipetrain::test {

using Clock = std::chrono::steady_clock;

inline double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

inline std::string temp(const std::string& name) {
  return ::testing::TempDir() + "/pipetrain_proc_" + std::to_string(::getpid()) + "_" + name;
}

inline std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = temp(name);
  std::ofstream(path) << text;
  return path;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every command line runs under `timeout`, so a hang fails the test instead of the suite.
inline Result run(const std::string& args) {
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

inline Rank spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
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
inline bool wait_ranks(std::vector<Rank>& ranks, const std::vector<int>& except, Clock::time_point t0, double limit_s) {
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

inline std::map<std::string, std::string> rank_env(int rank, int world, int port, const std::string& addr = "127.0.0.1") {
  return {{"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(rank)}, {"MASTER_ADDR", addr},
          {"MASTER_PORT", std::to_string(port)}, {"PIPETRAIN_FAULT", ""}};
}

// A small MLP job of two ranks: Adam with gradient clipping, five steps.
inline const std::string kMlp = R"({
  "model": {"family": "mlp", "in": 8, "width": 16, "layers": 4, "out": 4},
  "data": {"kind": "synthetic", "batch_size": 16, "samples": 128, "test_samples": 32},
  "pipeline": {"stages": 2, "micro_batches": 4},
  "optimizer": {"kind": "adam", "lr": 0.01, "grad_clip": 1.0},
  "train": {"steps": 5},
  "runtime": {"timeout_s": 60}
})";

inline std::string pipetrain_binary() { return PIPETRAIN_BINARY; }

}  // namespace pipetrain::test
