// comm: who this process is in a multi-process job, read from the environment that an existing
// launcher sets. Pure functions of an environment map, so every case is unit-testable; no
// libtorch here.
//
// Launchers, in order of precedence (the first whose rank variable is set wins):
//   torchrun   RANK, WORLD_SIZE, LOCAL_RANK (optional, 0), MASTER_ADDR, MASTER_PORT
//   OpenMPI    OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//   Slurm      SLURM_PROCID, SLURM_NTASKS (or SLURM_NPROCS), SLURM_LOCALID
// Variables of a launcher further down are not cross-checked: a Slurm batch step that runs
// mpirun passes SLURM_PROCID=0 to every rank, which is not a contradiction.
//
// The rendezvous host is MASTER_ADDR when set; otherwise under Slurm the first host of
// SLURM_JOB_NODELIST (or SLURM_NODELIST, e.g. "node[01-04]" gives "node01"); under OpenMPI
// 127.0.0.1 when every rank runs on this host (OMPI_COMM_WORLD_LOCAL_SIZE equals the world);
// without a launcher 127.0.0.1. The port is MASTER_PORT, else 29500 (c10d's default).
#pragma once

#include <map>
#include <string>

namespace pipetrain::comm {

/// Variables by name.
using Environment = std::map<std::string, std::string>;

/// A rank's identity, as a launcher gives it.
struct RankInfo {
  int rank = 0;         ///< RANK, OMPI_COMM_WORLD_RANK or SLURM_PROCID
  int world_size = 1;   ///< WORLD_SIZE, OMPI_COMM_WORLD_SIZE or SLURM_NTASKS
  int local_rank = 0;   ///< this rank's place among those on its host
  int local_world_size = 0;  ///< ranks on this host (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE,
                             ///< SLURM_NTASKS_PER_NODE); 0: not known
  std::string master_addr = "127.0.0.1";  ///< rank 0's host (MASTER_ADDR, or Slurm's first node)
  int master_port = 29500;                ///< rank 0's store (MASTER_PORT)
  std::string launcher = "none";  ///< "torchrun", "openmpi", "slurm" or "none" (a single process)
  /// The job's identity, the same on every rank of one job and different between jobs:
  /// PIPETRAIN_RUN_TOKEN (pipetrain launch sets it), else TORCHELASTIC_RUN_ID (torchrun), else
  /// SLURM_JOB_ID.SLURM_STEP_ID, else OpenMPI's PMIX_NAMESPACE; "" when none of them is set.
  std::string run_token;
};

/// Throws ConfigError naming the variable for a missing, malformed or inconsistent value.
RankInfo rank_from_env(const Environment& env);

/// This process's environment, for rank_from_env.
Environment process_environment();

/// The first host of a Slurm host list: "a,b" -> "a", "node[01-04,07]" -> "node01",
/// "rack[2-3]-n[5-6]" -> "rack2-n5". Throws ConfigError for an empty or unbalanced list.
std::string first_slurm_host(const std::string& nodelist);

}  // namespace pipetrain::comm
