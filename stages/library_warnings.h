// libtorch's warnings (TORCH_WARN) as this program's own messages: one line each, through
// common/log.h ("pipetrain: warning: libtorch: ..."), the first line of the message only, without
// the library's source file and function, and each distinct message once per process. libtorch's
// default handler prints "[W1126 08:00:00.000 123 path/to/file.cpp:42] Warning: ... (function f)",
// sometimes over several lines, which a user cannot act on and which breaks the one-line rule.
#pragma once

#include <string>

namespace pipetrain::stages {

/// Installs the handler for the whole process (call once, early: libtorch's setter is not
/// thread-safe). Idempotent.
void route_library_warnings();

/// What is shown of a libtorch message (a warning's, an error's): its first line, trimmed, printable.
std::string library_message_line(const std::string& message);

}  // namespace pipetrain::stages
