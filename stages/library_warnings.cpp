// libtorch's warnings through common/log.h (library_warnings.h).
#include "stages/library_warnings.h"

#include <algorithm>
#include <cctype>
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

namespace {
// A TorchScript interpreter's error opens with a generic line and a traceback; the cause is its
// last "<Kind>Error: ..." line (a c10::Error may append a C++ backtrace after it).
std::string script_cause(const std::string& message) {
  std::string cause;
  for (size_t start = 0; start < message.size();) {
    size_t end = message.find('\n', start);
    if (end == std::string::npos) end = message.size();
    const std::string line = message.substr(start, end - start);
    const size_t colon = line.find(": ");
    if (colon != std::string::npos && colon > 5 && line.compare(colon - 5, 5, "Error") == 0 &&
        std::all_of(line.begin(), line.begin() + static_cast<long>(colon), [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_'; }))
      cause = line.substr(colon + 2) + " (in TorchScript)";
    start = end + 1;
  }
  return cause;
}
}  // namespace

std::string library_message_line(const std::string& message) {
  if (message.rfind("The following operation failed in the TorchScript interpreter", 0) == 0) {
    const std::string cause = script_cause(message);
    if (!cause.empty()) return library_message_line(cause);
  }
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
