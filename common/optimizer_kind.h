// The optimizers a config can name (optimizer.kind), as vocabulary: the enum and its names.
// What each one's state holds, and how it is copied, sharded and saved, is the codec's
// (pipeline/optimizer_state.h); nothing here includes libtorch.
#pragma once

#include <string>
#include <vector>

namespace pipetrain {

enum class OptimizerKind { SGD, Adam, AdamW };

// "sgd", "adam", "adamw", in that order.
const std::vector<std::string>& optimizer_names();
const char* optimizer_name(OptimizerKind kind);
// The kind of a name in optimizer_names(); ConfigError naming `where` and the known names otherwise.
OptimizerKind parse_optimizer(const std::string& name, const std::string& where = "optimizer.kind");

}  // namespace pipetrain
