#include "apps/common_options.h"

#include <cmath>

#include "common/error.h"
#include "common/strings.h"

namespace pipetrain::apps {

namespace {

// The value of `--steps TEXT`: a whole number from 0 to 2^40 (as train.steps). Read by hand, not
// by CLI11, so that a bad value is a ConfigError with the config's own wording.
int64_t parse_steps_flag(const std::string& text) {
  constexpr int64_t kMax = int64_t(1) << 40;
  int64_t v = 0;
  bool ok = !text.empty() && text.size() <= 14;
  for (char ch : text) {
    if (ch < '0' || ch > '9') ok = false;
    if (ok) v = v * 10 + (ch - '0');
  }
  if (!ok || v > kMax)
    throw ConfigError(detail::concat("--steps ", printable(text, 40),
                                     ": expected a whole number of steps from 0 to ", kMax));
  return v;
}

}  // namespace

void ConfigOptions::add_path(CLI::App* subcommand, const std::string& description) {
  subcommand->add_option("config", path, description)->required();
}

void ConfigOptions::add_set(CLI::App* subcommand) {
  subcommand->add_option(kSetFlag, overrides, "Override a config key: key.path=value (repeatable)");
}

void ConfigOptions::add_steps(CLI::App* subcommand) {
  subcommand->add_option("--steps", steps, "Number of training steps (instead of train.steps)");
}

void ConfigOptions::add_quiet(CLI::App* subcommand) {
  subcommand->add_flag("--quiet", quiet, "No progress line");
}

job::Config ConfigOptions::load() const {
  job::Config config = job::load_config(path, overrides);
  if (!steps.empty()) config.train.steps = parse_steps_flag(steps);
  return config;
}

ProgressLine ConfigOptions::progress(const job::Config& config) const {
  return ProgressLine(quiet, config.train.log_every);
}

namespace {
CLI::Validator number_check(bool zero_allowed) {
  return CLI::Validator(
      [zero_allowed](std::string& text) -> std::string {
        size_t used = 0;
        double v = 0;
        try {
          v = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size() || !std::isfinite(v)) return "not a number: " + printable(text, 40);
        if (v < 0 || (v == 0 && !zero_allowed))
          return std::string(zero_allowed ? "must be zero or more" : "must be positive") + ", got " + printable(text, 40);
        return "";
      },
      zero_allowed ? "NUMBER >= 0" : "NUMBER > 0");
}
}  // namespace

const CLI::Validator kPositive = number_check(false);
const CLI::Validator kNonNegative = number_check(true);

}  // namespace pipetrain::apps
