// `pipetrain launch`: starts N local ranks the way torchrun does. Each rank gets RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT in its environment; its
// output lines are prefixed with "[rank i] "; SIGINT and SIGTERM are forwarded to every rank;
// when a rank fails, the others get SIGTERM (then SIGKILL after a grace period) and the launcher
// exits with the failed rank's status. No libtorch here.
#pragma once

#include <string>
#include <vector>

namespace pipetrain::launch {

struct LaunchOptions {
  int nproc = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;       // 0: a free loopback port, chosen here
  double grace_s = 10;       // after a failure, how long the other ranks get to exit on SIGTERM
  // After a rank fails, stop every rank and start them all again, up to this many times; a
  // `train` command then continues from its latest complete checkpoint (--resume is added).
  int max_restarts = 0;
  // Shrinking (torchrun's --nnodes MIN:MAX): when the same rank is the first to fail in two
  // attempts in a row, its slot is taken as gone for good and the next attempt starts one rank
  // fewer, as long as that leaves at least this many (0: never shrink). Each rank of a shrunk
  // attempt sees PIPETRAIN_SHRUNK (the ranks first started); a train command then runs as many
  // stages as the ranks allow and resumes its checkpoint re-partitioned.
  int min_nproc = 0;
  std::vector<std::string> command;  // a pipetrain subcommand and its arguments, or a program
  std::string self;          // the pipetrain binary (for subcommands)
  // pipetrain's subcommands (from its command-line parser): a command that starts with one runs `self`.
  std::vector<std::string> subcommands;
};

// Runs the ranks to the end (restarting them after a failure, up to max_restarts times; not after
// the launcher was asked to stop); returns the exit status for the launcher: 0 when every rank
// succeeded, else the first failed rank's status (128 + signal for a rank killed by a signal).
// Each rank sees PIPETRAIN_RESTART (the attempt, 0 first) and PIPETRAIN_RESTART_CAUSE. A rank
// that exits with status 2 (a usage or configuration error) is not restarted: it would fail again.
int run(const LaunchOptions& options);

}  // namespace pipetrain::launch
