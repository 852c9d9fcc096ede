// Levelled messages on stderr, one line each: "pipetrain: warning: ...", and, in a run of several
// ranks, the rank in the prefix ("pipetrain[rank 2]: error: ..."), so that the interleaved
// output of a launch says who said what. spdlog underneath (its stderr sink, which locks per
// line, and its level filter); nothing here includes spdlog, so that a file that includes
// libtorch (which carries another fmt) can log.
//
// The level comes from PIPETRAIN_LOG_LEVEL when the first message is logged, or set_level (the
// command line's --log-level); info by default.
#pragma once

#include <string>

namespace pipetrain::log {

enum class Level { Debug, Info, Warning, Error, Off };

/// "debug", "info", "warning", "error", "off".
const char* level_name(Level level);
/// The level `text` names (the names above, and "warn"); ConfigError naming `where` otherwise.
Level parse_level(const std::string& text, const std::string& where);

void set_level(Level level);
Level level();
bool enabled(Level level);

/// This process's rank in a run of `world` ranks; the prefix names it when world > 1, unless
/// PIPETRAIN_LOG_RANK is 0 (`pipetrain launch` sets it: it prefixes its ranks' lines itself).
void set_rank(int rank, int world);
/// The program's name in the prefix: "pipetrain" unless set ("pipetrain launch").
void set_name(const std::string& name);
/// "pipetrain" or "pipetrain[rank 2]".
std::string prefix();

/// One line: the prefix, the level's word (none for info), `message`.
void write(Level level, const std::string& message);
inline void debug(const std::string& m) { write(Level::Debug, m); }
inline void info(const std::string& m) { write(Level::Info, m); }
inline void warning(const std::string& m) { write(Level::Warning, m); }
inline void error(const std::string& m) { write(Level::Error, m); }

/// `text` as it is (no prefix, no newline added) at `level`, after the lines logged before it:
/// the progress line that a terminal redraws in place.
void raw(Level level, const std::string& text);

}  // namespace pipetrain::log
