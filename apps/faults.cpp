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
  const std::string specs = env;
  // The attempt this process belongs to (pipetrain launch --max-restarts counts them from 0).
  const char* restart = std::getenv("PIPETRAIN_RESTART");
  const int attempt = restart ? std::atoi(restart) : 0;
  struct Fault {
    std::string point;
    int rank;
    int64_t step;
    int signal;
  };
  std::vector<Fault> faults;
  for (const std::string& spec : fields(specs, ',')) {
    const auto bad = [&](const std::string& why) {
      return ConfigError("PIPETRAIN_FAULT=" + printable(specs, 80) + ": " + why +
                         " (expected POINT:RANK:STEP:kill|stop[:ATTEMPT], several separated by ',', POINT "
                         "pipeline.step, pipeline.reduce or checkpoint.shard)");
    };
    const std::vector<std::string> parts = fields(spec, ':');
    if (parts.size() != 4 && parts.size() != 5) throw bad("four or five fields separated by ':'");
    const std::string point = parts[0];
    if (point != "pipeline.step" && point != "pipeline.reduce" && point != "checkpoint.shard")
      throw bad("unknown point " + printable(point, 40));
    int rank = 0, only = 0;
    int64_t step = 0;
    try {
      size_t used = 0;
      rank = std::stoi(parts[1], &used);
      if (used != parts[1].size() || rank < 0) throw bad("RANK must be a rank number");
      step = std::stoll(parts[2], &used);
      if (used != parts[2].size() || step < 0) throw bad("STEP must be a step number");
      if (parts.size() == 5) {
        only = std::stoi(parts[4], &used);
        if (used != parts[4].size() || only < 0) throw bad("ATTEMPT must be an attempt number");
      }
    } catch (const std::logic_error&) {
      throw bad("RANK, STEP and ATTEMPT must be numbers");
    }
    const int signal = parts[3] == "kill" ? SIGKILL : parts[3] == "stop" ? SIGSTOP : 0;
    if (!signal) throw bad("unknown action " + printable(parts[3], 20));
    if (only == attempt) faults.push_back({point, rank, step, signal});  // another attempt's: not this one
  }
  if (faults.empty()) return;
  auto fired = std::make_shared<std::vector<std::atomic<bool>>>(faults.size());
  set_fault_hook([faults, fired](const FaultPoint& p) {
    for (size_t i = 0; i < faults.size(); ++i)
      if (faults[i].point == p.where && faults[i].rank == p.rank && faults[i].step == p.step &&
          !(*fired)[i].exchange(true))
        std::raise(faults[i].signal);
  });
}

}  // namespace pipetrain::apps
