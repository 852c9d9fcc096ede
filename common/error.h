// common: the error hierarchy, deadlines and the pipeline's deterministic random streams,
// shared by every folder. Nothing here includes libtorch.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

/// Everything pipetrain defines: errors, deadlines and skips here; the rest in its folders' namespaces.
namespace pipetrain {

/// Base of every error pipetrain throws on purpose. what() is one line meant for the user.
class Error : public std::runtime_error {
 public:
  /// `msg`: one printable line, what went wrong and where.
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

/// Bad configuration or command-line input; the message starts with where (file or flag, key path).
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A file could not be written, flushed, renamed or read; names the path and the system's reason.
class IoError : public Error {
 public:
  using Error::Error;
};

/// Bad data file or data-set request.
class DataError : public Error {
 public:
  using Error::Error;
};

/// A schedule that breaks its contract (missing action, unmatched send, deadlock).
class ScheduleError : public Error {
 public:
  using Error::Error;
};

/// A message could not be sent or received; names the peer rank.
class TransportError : public Error {
 public:
  /// `peer`: the rank at fault (-1 when none can be told).
  TransportError(int peer, const std::string& msg) : Error(msg), peer_(peer) {}
  /// The rank at fault, or -1.
  int peer() const { return peer_; }

 private:
  int peer_;
};

/// A deadline passed while waiting on a peer.
class TimeoutError : public TransportError {
 public:
  using TransportError::TransportError;
};

/// Broken internal invariant: a bug in pipetrain, reported with file:line.
class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace pipetrain

// Checks an internal invariant; on failure throws InternalError with file:line.
#define PIPETRAIN_CHECK(cond, ...)                                                          \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      throw ::pipetrain::InternalError(::pipetrain::detail::concat(                        \
          "[", __FILE__, ":", __LINE__, "] check failed: " #cond " ", ##__VA_ARGS__));     \
    }                                                                                      \
  } while (0)
