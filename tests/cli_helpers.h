// Shared by the command-line suites (cli_test, cli_plan_test, cli_resume_test): the pipetrain
// binary run as a user runs it, and configs written to scratch files.
#pragma once

#include <unistd.h>

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/process_helpers.h"

namespace pipetrain::test {

/// Runs `pipetrain ARGS` with stderr folded into stdout.
inline Result run(const std::string& args) { return shell(std::string(PIPETRAIN_BINARY) + " " + args + " 2>&1"); }

/// Writes `text` to a scratch file of this process named after `name`; returns its path.
inline std::string write_config(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/pipetrain_cli_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace pipetrain::test

// The names every command-line suite uses unqualified (this header serves those suites only).
using pipetrain::test::expect_clean_error;
using pipetrain::test::Result;
using pipetrain::test::run;
using pipetrain::test::shell;
using pipetrain::test::write_config;
inline const std::string& kSmall = pipetrain::test::kSmallConfig;
