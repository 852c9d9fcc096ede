#include "apps/progress.h"

#include "apps/option_flags.h"

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

const char* ProgressLine::fresh_line() const { return tty_ && !quiet_ ? "\n" : ""; }

void ProgressLine::note(const std::string& text) { std::fprintf(stderr, "pipetrain: %s\n", with_flags(text).c_str()); }

void ProgressLine::started(const std::string& description, const std::string& resumed_from, int64_t first_step,
                           int64_t steps) {
  steps_ = steps;
  if (!resumed_from.empty() && !quiet_)
    std::fprintf(stderr, "pipetrain: resuming from %s (step %lld of %lld)\n", resumed_from.c_str(),
                 static_cast<long long>(first_step), static_cast<long long>(steps));
  std::fprintf(stderr, "pipetrain: %s\n", description.c_str());
  window_start_ = Clock::now();
}

void ProgressLine::stepped(const train::StepReport& r) {
  if (!r.skipped.empty())
    std::fprintf(stderr, "%spipetrain: step %lld: %s; update skipped\n", fresh_line(), static_cast<long long>(r.step),
                 r.skipped.c_str());
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
    std::fprintf(stderr, "%sstep %lld/%lld | loss %.4f | %.0f samples/s | %s elapsed | %s left%s", tty_ ? "\r" : "",
                 static_cast<long long>(r.step), static_cast<long long>(r.steps), r.loss, rate_,
                 clock_text(r.elapsed_s).c_str(), clock_text(eta).c_str(), tty_ ? "   " : "\n");
    if (tty_ && last) std::fprintf(stderr, "\n");
  }
}

void ProgressLine::evaluated(int64_t step, const train::TrainResult& result) {
  if (!quiet_)
    std::fprintf(stderr, "%sstep %lld: %s\n", fresh_line(), static_cast<long long>(step),
                 train::describe_test(result).c_str());
}

void ProgressLine::saved(const std::string& checkpoint) {
  if (!quiet_) std::fprintf(stderr, "%spipetrain: checkpoint %s\n", fresh_line(), checkpoint.c_str());
}

void ProgressLine::ended(const train::TrainResult& r) {
  if (quiet_) return;
  if (r.stopped_at > 0) {
    std::fprintf(stderr, "pipetrain: stopped at step %lld of %lld%s; continue with --resume\n",
                 static_cast<long long>(r.stopped_at), static_cast<long long>(steps_),
                 r.stop_request ? (r.stop_request == SIGINT ? " (SIGINT)" : " (SIGTERM)") : "");
    return;
  }
  std::fprintf(stderr, "pipetrain: %zu steps in %s, %.1f samples/s, final loss %.4f%s\n", r.losses.size(),
               clock_text(r.seconds).c_str(), r.samples_per_s, r.losses.empty() ? 0.0 : r.losses.back(),
               r.skipped_steps ? (", " + std::to_string(r.skipped_steps) + " updates skipped").c_str() : "");
}

}  // namespace pipetrain::apps
