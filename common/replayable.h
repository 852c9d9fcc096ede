// What a CUDA graph cannot replay (pipeline.cuda_graphs, stages/graphs.h). A graph replays the
// kernels a forward issued once; a layer whose forward depends on the host each time (dropout's
// keys, drawn per step and sample; the TorchScript interpreter) says so while it runs, and the
// stage, which runs its forwards eagerly for one step before capturing them, reads it back.
#pragma once

#include <string>

namespace pipetrain {

/// Notes, on the calling thread, why the forward running now cannot be replayed from a graph
/// ("dropout draws keyed masks from the host"); the first note is kept until taken.
void note_not_replayable(const char* why);

/// The calling thread's first note since the last call, or "" when none was made.
std::string take_not_replayable();

}  // namespace pipetrain
