// Levelled messages through spdlog (common/log.h).
#include "common/log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "common/error.h"

namespace pipetrain::log {

namespace {

spdlog::level::level_enum to_spdlog(Level l) {
  switch (l) {
    case Level::Debug: return spdlog::level::debug;
    case Level::Info: return spdlog::level::info;
    case Level::Warning: return spdlog::level::warn;
    case Level::Error: return spdlog::level::err;
    case Level::Off: break;
  }
  return spdlog::level::off;
}

// The level's word after the prefix: none for info.
const char* word(spdlog::level::level_enum l) {
  switch (l) {
    case spdlog::level::debug: return "debug: ";
    case spdlog::level::warn: return "warning: ";
    case spdlog::level::err: return "error: ";
    default: return "";
  }
}

struct State {
  std::mutex mu;
  std::shared_ptr<spdlog::logger> logger;
  std::string name = "pipetrain", rank;  // rank: "[rank 2]" or ""
  Level level = Level::Info;

  State() {
    if (const char* env = std::getenv("PIPETRAIN_LOG_LEVEL"); env && *env) {
      try {
        level = parse_level(env, "PIPETRAIN_LOG_LEVEL");
      } catch (const ConfigError& e) {
        std::fprintf(stderr, "pipetrain: warning: %s; logging at info\n", e.what());
      }
    }
    // Its own logger, not spdlog's registry: an embedding program's loggers stay its own.
    logger = std::make_shared<spdlog::logger>("pipetrain", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    logger->set_pattern("%v");
    logger->set_level(to_spdlog(level));
    logger->flush_on(spdlog::level::debug);  // stderr: every line as it is logged
  }
};

State& state() {
  static State s;
  return s;
}

}  // namespace

const char* level_name(Level level) {
  switch (level) {
    case Level::Debug: return "debug";
    case Level::Info: return "info";
    case Level::Warning: return "warning";
    case Level::Error: return "error";
    case Level::Off: break;
  }
  return "off";
}

Level parse_level(const std::string& text, const std::string& where) {
  for (Level l : {Level::Debug, Level::Info, Level::Warning, Level::Error, Level::Off})
    if (text == level_name(l)) return l;
  if (text == "warn") return Level::Warning;
  throw ConfigError(where + ": unknown log level '" + text + "' (debug, info, warning, error, off)");
}

void set_level(Level l) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.level = l;
  s.logger->set_level(to_spdlog(l));
}

Level level() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.level;
}

bool enabled(Level l) { return l != Level::Off && state().logger->should_log(to_spdlog(l)); }

void set_rank(int rank, int world) {
  const char* env = std::getenv("PIPETRAIN_LOG_RANK");
  const bool shown = world > 1 && !(env && std::string(env) == "0");
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.rank = shown ? "[rank " + std::to_string(rank) + "]" : "";
}

void set_name(const std::string& name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.name = name;
}

std::string prefix() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.name + s.rank;
}

void write(Level l, const std::string& message) {
  if (!enabled(l)) return;
  const auto level = to_spdlog(l);
  state().logger->log(level, "{}: {}{}", prefix(), word(level), message);
}

void raw(Level l, const std::string& text) {
  if (!enabled(l)) return;
  // stdio's lock on stderr keeps the text whole among the lines the sink writes.
  state().logger->flush();
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace pipetrain::log
