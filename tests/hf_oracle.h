// Shared by the suites that check the hf family against transformers (hf_test,
// generate_hf_test): a scratch directory, the project's Python and tests/hf_models.py, which makes
// tiny transformers models and says what transformers computes with them.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "tests/process_helpers.h"

namespace pipetrain::test {

/// TempDir()/pipetrain_<name>_<pid>, made if need be.
inline std::string scratch_dir(const std::string& name) {
  const std::string p = ::testing::TempDir() + "/pipetrain_" + name + "_" + std::to_string(::getpid());
  std::filesystem::create_directories(p);
  return p;
}

inline std::string python() { return PIPETRAIN_PYTHON; }
inline std::string hf_oracle() { return std::string(PIPETRAIN_SOURCE_DIR) + "/tests/hf_models.py"; }
/// Whether the project's Python has transformers (scripts/setup.sh installs it); without it the
/// cases that need it are skipped.
inline bool has_transformers() { return shell(python() + " -c 'import transformers' >/dev/null 2>&1").status == 0; }

}  // namespace pipetrain::test
