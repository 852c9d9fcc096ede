#include "comm/launcher_env.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <vector>

#include "common/error.h"

extern char** environ;

namespace pipetrain::comm {

namespace {

const std::string* find(const Environment& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() ? nullptr : &it->second;
}

// A whole decimal integer in [min, max]; the error names the variable and its value.
int parse_int(const std::string& key, const std::string& text, long min, long max) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE)
    throw ConfigError(key + "=" + text + " is not an integer");
  if (v < min || v > max)
    throw ConfigError(detail::concat(key, "=", text, " is outside [", min, ", ", max, "]"));
  return static_cast<int>(v);
}

int require_int(const Environment& env, const std::string& key, const std::string& because, long min,
                long max) {
  const std::string* v = find(env, key);
  if (!v) throw ConfigError(key + " is not set but " + because);
  return parse_int(key, *v, min, max);
}

int optional_int(const Environment& env, const std::string& key, int def, long min, long max) {
  const std::string* v = find(env, key);
  return v ? parse_int(key, *v, min, max) : def;
}

// Names of one launcher's variables.
struct Launcher {
  const char* name;
  const char* rank;
  std::vector<const char*> size;  // the first one that is set counts
  const char* local_rank;
  const char* local_size;  // ranks on this host
};

const std::vector<Launcher>& launchers() {
  static const std::vector<Launcher> all{
      {"torchrun", "RANK", {"WORLD_SIZE"}, "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", {"OMPI_COMM_WORLD_SIZE"}, "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"slurm", "SLURM_PROCID", {"SLURM_NTASKS", "SLURM_NPROCS"}, "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
  };
  return all;
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // The first item at bracket depth 0.
  std::string item;
  int depth = 0;
  for (char c : nodelist) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) break;
    if (c == ',' && depth == 0) break;
    item += c;
  }
  if (depth != 0 || item.empty())
    throw ConfigError("cannot read the first host of the Slurm node list \"" + nodelist + "\"");
  // Each bracket group becomes its first value ("01-04,07" -> "01"), zero padding kept.
  std::string host;
  for (size_t i = 0; i < item.size(); ++i) {
    if (item[i] != '[') {
      host += item[i];
      continue;
    }
    const size_t close = item.find(']', i);
    if (close == std::string::npos)
      throw ConfigError("cannot read the first host of the Slurm node list \"" + nodelist + "\"");
    const std::string group = item.substr(i + 1, close - i - 1);
    const std::string first = group.substr(0, group.find_first_of(",-"));
    if (first.empty())
      throw ConfigError("cannot read the first host of the Slurm node list \"" + nodelist + "\"");
    host += first;
    i = close;
  }
  return host;
}

RankInfo rank_from_env(const Environment& env) {
  RankInfo info;
  const Launcher* chosen = nullptr;
  for (const Launcher& l : launchers())
    if (find(env, l.rank)) {
      chosen = &l;
      break;
    }
  if (chosen) {
    info.launcher = chosen->name;
    const char* size_key = chosen->size.front();
    for (const char* k : chosen->size)
      if (find(env, k)) {
        size_key = k;
        break;
      }
    info.world_size = require_int(env, size_key, std::string(chosen->rank) + " is", 1, INT_MAX);
    info.rank = parse_int(chosen->rank, *find(env, chosen->rank), 0, INT_MAX);
    if (info.rank >= info.world_size)
      throw ConfigError(detail::concat(chosen->rank, "=", info.rank, " but ", size_key, "=", info.world_size,
                                       ": the rank must be below the world size"));
    info.local_rank = optional_int(env, chosen->local_rank, 0, 0, INT_MAX);
    if (info.local_rank >= info.world_size)
      throw ConfigError(detail::concat(chosen->local_rank, "=", info.local_rank, " but ", size_key, "=",
                                       info.world_size, ": the local rank must be below the world size"));
    // Slurm writes SLURM_NTASKS_PER_NODE as "2(x3)" on uneven layouts: then unknown.
    const std::string* local = find(env, chosen->local_size);
    if (local && local->find_first_not_of("0123456789") == std::string::npos)
      info.local_world_size = parse_int(chosen->local_size, *local, 1, info.world_size);
  }

  if (const std::string* t = find(env, "PIPETRAIN_RUN_TOKEN"))
    info.run_token = *t;
  else if (const std::string* t = find(env, "TORCHELASTIC_RUN_ID"))
    info.run_token = "torchrun:" + *t;
  else if (const std::string* t = find(env, "SLURM_JOB_ID"))
    info.run_token = "slurm:" + *t + "." + (find(env, "SLURM_STEP_ID") ? *find(env, "SLURM_STEP_ID") : "");
  else if (const std::string* t = find(env, "PMIX_NAMESPACE"))
    info.run_token = "openmpi:" + *t;
  if (info.run_token.size() > 256) throw ConfigError("the job's run token (PIPETRAIN_RUN_TOKEN, ...) is over 256 bytes");
  info.master_port = optional_int(env, "MASTER_PORT", info.master_port, 1, 65535);
  if (const std::string* addr = find(env, "MASTER_ADDR")) {
    if (addr->empty()) throw ConfigError("MASTER_ADDR is set but empty");
    info.master_addr = *addr;
  } else if (info.launcher == "torchrun" && info.world_size > 1) {
    throw ConfigError(
        "MASTER_ADDR is not set but RANK and WORLD_SIZE are (torchrun sets all of them; "
        "set MASTER_ADDR to the host of rank 0)");
  } else if (info.launcher == "slurm") {
    const std::string* list = find(env, "SLURM_JOB_NODELIST");
    if (!list) list = find(env, "SLURM_NODELIST");
    if (!list && info.world_size > 1)
      throw ConfigError(
          "neither MASTER_ADDR nor SLURM_JOB_NODELIST (SLURM_NODELIST) is set: "
          "cannot tell where rank 0 runs");
    if (list) info.master_addr = first_slurm_host(*list);
  } else if (info.launcher == "openmpi" && info.world_size > 1) {
    const int local_size = optional_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 0, 0, INT_MAX);
    if (local_size != info.world_size)
      throw ConfigError(
          "MASTER_ADDR is not set and the OpenMPI ranks span several hosts: "
          "pass the host of rank 0 (mpirun -x MASTER_ADDR=<host>)");
  }
  return info;
}

Environment process_environment() {
  Environment env;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

}  // namespace pipetrain::comm
