// How cores that compute at once slow each other, measured: the config's model, one forward and
// backward of ceil(batch / n) samples, on n threads at once (each its own copy of the model and
// one intra-op thread, as n single-threaded stages or data-parallel copies run) against one
// thread alone. Shared caches and memory bandwidth make each of n busy cores slower than one
// alone; how much depends on the machine and the model, so the planner measures it rather than
// assuming it. The same runs give the straggler wait of a data-parallel reduction: the copies
// start each repetition together, and each waits at the reduction for the slowest.
#pragma once

#include "common/precision.h"
#include "job/config.h"

namespace pipetrain::planner {

struct Concurrency {
  int workers = 1;
  double alone_ms = 0;      // the median time of one run with the other cores idle
  double together_ms = 0;   // the median time of one run while `workers` run at once
  double slowdown = 1;      // together_ms / alone_ms, at least 1
  // The mean, over repetitions, of (the slowest worker's time - the workers' mean time), as a
  // share of together_ms: how long a copy waits at a reduction for the slowest copy.
  double straggler = 0;
};

// `workers` >= 2 threads; `repeat` timed runs on each (after one warm-up run), each repetition
// started together on every thread.
Concurrency measure_concurrency(const job::Config& config, Precision precision, int workers, int repeat);

}  // namespace pipetrain::planner
