// mesh: the parallel layout of a job, declared once: `stages` pipeline stages (devices) times
// `data_parallel` copies of the pipeline, pipeline outer and data inner as torchtitan lays them
// out, so a stage's copies sit on neighbouring ranks. Every rank number of the engine and the
// run layer is computed here and nowhere else.
#pragma once

#include <vector>

#include "common/error.h"

namespace pipetrain::comm {

/// The layout of ranks: stages x data_parallel copies; rank = stage * data_parallel + copy.
struct Mesh {
  int stages = 1;         ///< pipeline stages (devices of one copy)
  int data_parallel = 1;  ///< copies of the pipeline (the data-parallel degree)

  int world() const { return stages * data_parallel; }  ///< ranks in all
  /// The rank that runs `stage` of copy `copy`.
  int rank(int stage, int copy) const {
    PIPETRAIN_CHECK(stage >= 0 && stage < stages && copy >= 0 && copy < data_parallel, "stage ", stage, " copy ", copy);
    return stage * data_parallel + copy;
  }
  int stage_of(int rank) const { return checked(rank) / data_parallel; }  ///< the stage a rank runs
  int copy_of(int rank) const { return checked(rank) % data_parallel; }   ///< the copy a rank belongs to

 private:
  int checked(int rank) const {
    PIPETRAIN_CHECK(rank >= 0 && rank < world(), "rank ", rank, " of ", world());
    return rank;
  }
};

}  // namespace pipetrain::comm
