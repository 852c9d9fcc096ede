// SIGINT and SIGTERM during a run that saves checkpoints: the handler only records the signal;
// the run finishes its step, saves and stops (train::TrainOptions::stop_requested). A second
// signal acts at once (the default action is restored after the first). Restores the previous
// handlers when it goes; a signal ignored before (a background job's ^C) stays ignored.
#pragma once

namespace pipetrain::apps {

class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  static int requested();  // the signal received, or 0

 private:
  void (*old_int_)(int);
  void (*old_term_)(int);
};

}  // namespace pipetrain::apps
