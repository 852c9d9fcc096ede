#include "common/broken_pipe.h"

#include <csignal>
#include <mutex>

namespace pipetrain {

bool ignore_broken_pipe() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) != 0) return false;
  if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_DFL) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    if (::sigaction(SIGPIPE, &ignore, nullptr) != 0) return false;
  }
  return true;
}

}  // namespace pipetrain
