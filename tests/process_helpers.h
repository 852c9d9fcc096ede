// Helpers of the suites that run commands and processes: a shell command's status and output,
// a free loopback port for a rendezvous, a small config, and the check of a one-line error.
#pragma once

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "comm/rendezvous.h"

namespace pipetrain::test {

struct Result {
  int status;       // the exit status; -1 when the command did not exit normally
  std::string out;  // its standard output
};

// Runs a shell command line; its exit status and stdout.
inline Result shell(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// A loopback port that was free a moment ago (the store binds it right after).
inline int free_port() { return comm::free_loopback_port(); }

// A config that trains in well under a second: a 3-layer MLP on 2 stages.
inline const std::string kSmallConfig = R"({
  "model": {"family": "mlp", "in": 8, "width": 8, "layers": 3, "out": 4},
  "data": {"kind": "synthetic", "batch_size": 8, "samples": 64, "test_samples": 16},
  "pipeline": {"stages": 2, "micro_batches": 2},
  "train": {"steps": 3}
})";

// The output of a failed command is one error line: "pipetrain: error: " and `needle` in it,
// printable ASCII, under 1000 characters, and the exit status is `status`.
inline void expect_clean_error(const Result& r, const std::string& needle, int status = 2) {
  const std::string shown = r.out.substr(0, 2000);
  EXPECT_EQ(r.status, status) << shown;
  EXPECT_EQ(r.out.rfind("pipetrain: error: ", 0), 0u) << shown;
  EXPECT_NE(r.out.find(needle), std::string::npos) << shown;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "not one line: " << shown;
  EXPECT_LT(r.out.size(), 1000u) << shown;
  for (unsigned char c : r.out) EXPECT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f)) << "byte " << int(c) << " in the message";
}

// The step lines of a metrics file (train --metrics), by step.
inline std::map<int, nlohmann::json> read_steps(const std::string& path) {
  std::map<int, nlohmann::json> steps;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("event", "") == "" && j.contains("step")) steps[j.at("step").get<int>()] = j;
  }
  return steps;
}

// The same losses and gradient norms, step by step, within `tol` relative (0: bit for bit).
inline void expect_same_steps(const std::map<int, nlohmann::json>& a, const std::map<int, nlohmann::json>& b, double tol, const std::string& what) {
  ASSERT_FALSE(a.empty()) << what;
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [step, j] : a)
    for (const char* key : {"loss", "grad_norm"}) {
      const double x = j.at(key).get<double>(), y = b.at(step).at(key).get<double>();
      if (tol == 0)
        EXPECT_EQ(x, y) << what << ": step " << step << " " << key;
      else
        EXPECT_NEAR(x, y, tol * std::abs(y)) << what << ": step " << step << " " << key;
    }
}

}  // namespace pipetrain::test
