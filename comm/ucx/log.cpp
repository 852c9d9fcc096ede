// ucx: UCX's own log messages through ours (internal.h: route_ucx_log). UCX prints them itself,
// by default on stdout, in its own format ("[time] [host:pid:thread] mm_ep.c:171 UCX ERROR
// ..."), interleaved with our one-line errors. Its handler stack (ucs/debug/log_def.h) lets a
// program see each message first: ours turns it into one line of common/log.h and stops it there.
//
// Levels. UCX's ERROR means "an error is returned to the user": every UCS status that comes back
// to us becomes our own error, which names the rank and what failed, so UCX's line about the
// same failure is a detail for --log-level debug. FATAL (UCX aborts next) is an error, WARN a
// warning, INFO and PRINT info, DIAG and the debug and trace levels debug. Which messages UCX
// produces at all is still UCX's choice (UCX_LOG_LEVEL, warn by default).
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include <ucs/config/global_opts.h>
#include <ucs/debug/log_def.h>

#include "comm/ucx/internal.h"
#include "comm/ucx/testing.h"
#include "common/error.h"
#include "common/log.h"

namespace pipetrain::comm::ucx {

namespace {

log::Level ours(ucs_log_level_t level) {
  switch (level) {
    case UCS_LOG_LEVEL_FATAL: return log::Level::Error;
    case UCS_LOG_LEVEL_ERROR: return log::Level::Debug;  // the status comes back and we report it
    case UCS_LOG_LEVEL_WARN: return log::Level::Warning;
    case UCS_LOG_LEVEL_INFO:
    case UCS_LOG_LEVEL_PRINT: return log::Level::Info;
    default: return log::Level::Debug;
  }
}

// The message on one line: UCX's few multi-line messages (configuration dumps) joined.
std::string one_line(const char* format, va_list ap) {
  char buffer[1024];
  va_list copy;
  va_copy(copy, ap);
  const int n = std::vsnprintf(buffer, sizeof buffer, format, copy);
  va_end(copy);
  std::string text(buffer, n < 0 ? 0 : std::min<size_t>(static_cast<size_t>(n), sizeof buffer - 1));
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

const char* base_name(const char* file) {
  const char* slash = file ? std::strrchr(file, '/') : nullptr;
  return slash ? slash + 1 : file ? file : "?";
}

ucs_log_func_rc_t route(const char* file, unsigned line, const char*, ucs_log_level_t level,
                        const ucs_log_component_config_t*, const char* format, va_list ap) {
  const log::Level level_here = ours(level);
  if (log::enabled(level_here))
    log::write(level_here, detail::concat("ucx: ", one_line(format, ap), " (", base_name(file), ":", line, ")"));
  return UCS_LOG_FUNC_RC_STOP;  // not UCX's default handler as well
}

ucs_log_func_rc_t drop(const char*, unsigned, const char*, ucs_log_level_t, const ucs_log_component_config_t*,
                       const char*, va_list) {
  return UCS_LOG_FUNC_RC_STOP;
}

}  // namespace

void route_ucx_log() {
  static std::once_flag once;  // the handler stack is UCX's, global and not thread-safe to change
  std::call_once(once, [] { ucs_log_push_handler(&route); });
}

void silence_ucx_log() { ucs_log_push_handler(&drop); }

}  // namespace pipetrain::comm::ucx

namespace pipetrain::comm {

void ucx_log_for_test(int ucs_level, const std::string& message) {
  ucs_log_dispatch(__FILE__, __LINE__, __func__, static_cast<ucs_log_level_t>(ucs_level), &ucs_global_opts.log_component,
                   "%s", message.c_str());
}

}  // namespace pipetrain::comm
