#include "apps/faults.h"

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/fault.h"
#include "common/strings.h"

namespace pipetrain::apps {

namespace {
std::vector<std::string> fields(const std::string& text, char sep) {
  std::vector<std::string> out(1);
  for (char ch : text) {
    if (ch == sep)
      out.emplace_back();
    else
      out.back() += ch;
  }
  return out;
}
}  // namespace

void install_faults_from_environment() {
  const char* env = std::getenv("PIPETRAIN_FAULT");
  if (!env || !*env) return;
  const std::string spec = env;
  const auto bad = [&](const std::string& why) {
    return ConfigError("PIPETRAIN_FAULT=" + printable(spec, 80) + ": " + why +
                       " (expected POINT:RANK:STEP:kill|stop, POINT pipeline.step, pipeline.reduce or checkpoint.shard)");
  };
  const std::vector<std::string> parts = fields(spec, ':');
  if (parts.size() != 4) throw bad("four fields separated by ':'");
  const std::string point = parts[0];
  if (point != "pipeline.step" && point != "pipeline.reduce" && point != "checkpoint.shard") throw bad("unknown point " + printable(point, 40));
  int rank = 0;
  int64_t step = 0;
  try {
    size_t used = 0;
    rank = std::stoi(parts[1], &used);
    if (used != parts[1].size() || rank < 0) throw bad("RANK must be a rank number");
    step = std::stoll(parts[2], &used);
    if (used != parts[2].size() || step < 0) throw bad("STEP must be a step number");
  } catch (const std::logic_error&) {
    throw bad("RANK and STEP must be numbers");
  }
  const int signal = parts[3] == "kill" ? SIGKILL : parts[3] == "stop" ? SIGSTOP : 0;
  if (!signal) throw bad("unknown action " + printable(parts[3], 20));
  auto fired = std::make_shared<std::atomic<bool>>(false);
  set_fault_hook([point, rank, step, signal, fired](const FaultPoint& p) {
    if (point == p.where && p.rank == rank && p.step == step && !fired->exchange(true)) std::raise(signal);
  });
}

}  // namespace pipetrain::apps
