// The terminal side of a training run: a progress line on stderr (redrawn in place on a
// terminal, every train.log_every steps otherwise), checkpoints, skipped updates, evaluations,
// notes and the closing summary, all at the info level of common/log.h (skipped updates and
// warnings at warning). Quiet: only the first line, notes and skipped updates.
#pragma once

#include "common/deadline.h"
#include "train/trainer.h"

namespace pipetrain::apps {

class ProgressLine final : public train::TrainObserver {
 public:
  ProgressLine(bool quiet, int64_t log_every);
  void note(const std::string& text) override;
  void started(const std::string& description, const std::string& resumed_from, int64_t first_step,
               int64_t steps) override;
  void stepped(const train::StepReport& r) override;
  void evaluated(int64_t step, const train::TrainResult& result) override;
  void saved(const std::string& checkpoint) override;
  void ended(const train::TrainResult& result) override;

 private:
  // A line printed while the progress line is drawn in place starts on a fresh line.
  void fresh_line() const;

  bool quiet_, tty_;
  int64_t log_every_;
  Clock::time_point window_start_ = Clock::now();
  int64_t window_samples_ = 0;
  double rate_ = 0;
  int64_t steps_ = 0;
};

// "1:26" or "1:02:03".
std::string clock_text(double seconds);

}  // namespace pipetrain::apps
