#include "apps/progress.h"

#include "apps/option_flags.h"
#include "common/error.h"
#include "common/log.h"

#include <unistd.h>

#include <csignal>
#include <cstdio>

namespace pipetrain::apps {

std::string clock_text(double seconds) {
  const long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

ProgressLine::ProgressLine(bool quiet, int64_t log_every)
    : quiet_(quiet), tty_(isatty(STDERR_FILENO)), log_every_(std::max<int64_t>(1, log_every)) {}

void ProgressLine::fresh_line() const {
  if (tty_ && !quiet_) log::raw(log::Level::Info, "\n");
}

void ProgressLine::note(const std::string& text) {
  const std::string line = with_flags(text);
  static const std::string kWarning = "warning: ";
  if (line.compare(0, kWarning.size(), kWarning) == 0)
    log::warning(line.substr(kWarning.size()));
  else
    log::info(line);
}

void ProgressLine::started(const std::string& description, const std::string& resumed_from, int64_t first_step,
                           int64_t steps) {
  steps_ = steps;
  if (!resumed_from.empty() && !quiet_)
    log::info(detail::concat("resuming from ", resumed_from, " (step ", first_step, " of ", steps, ")"));
  log::info(description);
  window_start_ = Clock::now();
}

void ProgressLine::stepped(const train::StepReport& r) {
  if (!r.skipped.empty()) {
    fresh_line();
    log::warning(detail::concat("step ", r.step, ": ", r.skipped, "; update skipped"));
  }
  if (quiet_) return;
  window_samples_ += r.samples;
  const auto now = Clock::now();
  const double window_s = std::chrono::duration<double>(now - window_start_).count();
  if (window_s >= 1.0 || rate_ == 0) {
    rate_ = window_s > 0 ? window_samples_ / window_s : 0;
    window_start_ = now;
    window_samples_ = 0;
  }
  const bool last = r.step == r.last_step;
  if (tty_ || r.step % log_every_ == 0 || last) {
    const double eta = rate_ > 0 ? static_cast<double>((r.last_step - r.step) * r.samples) / rate_ : 0;
    char line[256];
    std::snprintf(line, sizeof line, "%sstep %lld/%lld | loss %.4f | %.0f samples/s | %s elapsed | %s left%s",
                  tty_ ? "\r" : "", static_cast<long long>(r.step), static_cast<long long>(r.steps), r.loss, rate_,
                  clock_text(r.elapsed_s).c_str(), clock_text(eta).c_str(), tty_ ? (last ? "   \n" : "   ") : "\n");
    log::raw(log::Level::Info, line);
  }
}

void ProgressLine::evaluated(int64_t step, const train::TrainResult& result) {
  if (quiet_ || !log::enabled(log::Level::Info)) return;
  fresh_line();
  log::raw(log::Level::Info, detail::concat("step ", step, ": ", train::describe_test(result), "\n"));
}

void ProgressLine::saved(const std::string& checkpoint) {
  if (quiet_ || !log::enabled(log::Level::Info)) return;
  fresh_line();
  log::info("checkpoint " + checkpoint);
}

void ProgressLine::ended(const train::TrainResult& r) {
  if (quiet_) return;
  if (r.stopped_at > 0) {
    log::info(detail::concat("stopped at step ", r.stopped_at, " of ", steps_,
                             r.stop_request ? (r.stop_request == SIGINT ? " (SIGINT)" : " (SIGTERM)") : "",
                             "; continue with --resume"));
    return;
  }
  char rate[64], loss[64];
  std::snprintf(rate, sizeof rate, "%.1f", r.samples_per_s);
  std::snprintf(loss, sizeof loss, "%.4f", r.losses.empty() ? 0.0 : r.losses.back());
  log::info(detail::concat(r.losses.size(), " steps in ", clock_text(r.seconds), ", ", rate, " samples/s, final loss ",
                           loss, r.skipped_steps ? ", " + std::to_string(r.skipped_steps) + " updates skipped" : ""));
}

}  // namespace pipetrain::apps
