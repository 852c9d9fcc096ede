// A build without CUDA: no graphs (stages/graphs.h); the stage runs eagerly and says why.
#include "stages/graphs.h"

namespace pipetrain::stages {

std::unique_ptr<StageGraphs> make_stage_graphs(const c10::Device&) { return nullptr; }

}  // namespace pipetrain::stages
