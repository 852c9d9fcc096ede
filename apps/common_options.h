// The options that several subcommands share (the config file, --set, --steps, --quiet),
// spelled and described once, and what they make: the config as the command line changes it
// and the progress line of a run.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "apps/progress.h"
#include "job/config.h"

namespace pipetrain::apps {

struct ConfigOptions {
  std::string path;
  std::vector<std::string> overrides;  // --set key.path=value, in order
  std::string steps;                   // --steps as typed; empty: train.steps
  bool quiet = false;

  // One option each, so that every subcommand keeps its own order of options in --help.
  void add_path(CLI::App* subcommand, const std::string& description = "JSON config file");
  void add_set(CLI::App* subcommand);
  void add_steps(CLI::App* subcommand);
  void add_quiet(CLI::App* subcommand);

  // The file is read and checked as written; --steps then replaces its train.steps.
  job::Config load() const;
  ProgressLine progress(const job::Config& config) const;
};

// Checks of numeric options whose message says the rule ("--bytes: must be positive, got 0")
// rather than CLI11's range of a double, printed in 309 digits.
extern const CLI::Validator kPositive;
extern const CLI::Validator kNonNegative;

// How the messages of the run layer spell the override option.
inline constexpr const char* kSetFlag = "--set";

}  // namespace pipetrain::apps
