#include "apps/signals.h"

#include <atomic>
#include <csignal>

namespace pipetrain::apps {

namespace {
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) {
  g_stop_signal.store(sig);
  std::signal(sig, SIG_DFL);
}
}  // namespace

StopSignals::StopSignals() {
  g_stop_signal.store(0);
  old_int_ = std::signal(SIGINT, on_stop_signal);
  old_term_ = std::signal(SIGTERM, on_stop_signal);
  if (old_int_ == SIG_IGN) std::signal(SIGINT, SIG_IGN);
  if (old_term_ == SIG_IGN) std::signal(SIGTERM, SIG_IGN);
}

StopSignals::~StopSignals() {
  std::signal(SIGINT, old_int_);
  std::signal(SIGTERM, old_term_);
}

int StopSignals::requested() { return g_stop_signal.load(); }

}  // namespace pipetrain::apps
