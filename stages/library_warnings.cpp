// libtorch's warnings through common/log.h (library_warnings.h).
#include "stages/library_warnings.h"

#include <mutex>
#include <set>

#include <c10/util/Exception.h>

#include "common/log.h"
#include "common/strings.h"

namespace pipetrain::stages {

namespace {

class OneLineHandler final : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    const std::string line = library_message_line(warning.msg());
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (seen_.size() >= 1000 || !seen_.insert(line).second) return;  // once each, and a bounded set
    }
    log::warning("libtorch: " + line);
  }

 private:
  std::mutex mu_;
  std::set<std::string> seen_;
};

}  // namespace

std::string library_message_line(const std::string& message) {
  std::string text = message.substr(0, message.find('\n'));
  while (!text.empty() && (text.back() == ' ' || text.back() == '\r' || text.back() == '\t')) text.pop_back();
  return printable(text, 300);
}

void route_library_warnings() {
  static OneLineHandler* handler = [] {
    auto* h = new OneLineHandler();  // lives as long as the process, as libtorch requires
    c10::WarningUtils::set_warning_handler(h);
    return h;
  }();
  (void)handler;
}

}  // namespace pipetrain::stages
