// Run options set outside the config: a command line's flags, an embedding program's fields.
// Code below apps/ names them in messages by id, through option(); apps/ spells each as its flag,
// from one table, when it prints a message (apps/option_flags.h). render_options() spells them
// another way (option_name: "resume", "checkpoint_dir"), for an embedding program's messages.
#pragma once

#include <functional>
#include <string>

namespace pipetrain {

enum class Option {
  Override,       ///< a config key set from outside the file (the command line's --set)
  CheckpointDir,  ///< where checkpoints go, over train.checkpoint_dir
  Resume,         ///< continue from the latest complete checkpoint
  UntilStep,      ///< stop after this step, with a checkpoint
  Metrics,        ///< the metrics file
  Trace,          ///< the trace file
  TensorBoard,    ///< the TensorBoard directory, over train.tensorboard
  Devices,        ///< plan --auto, what-if: the device count
  Cores,          ///< plan --auto: the CPU cores to share out
  MemoryLimit,    ///< plan --auto: the bytes per device
  Speeds,         ///< plan --auto: the devices' relative speeds
  WriteConfig,    ///< plan --auto: where the chosen plan's config goes
  Efficiency,     ///< costs: the share of the peak the kernels reach
  LatencyMs,      ///< costs: the link's latency
  Layers,         ///< costs: the transformer's layers
  Hidden,         ///< costs: the transformer's hidden size
  Seq,            ///< costs: its sequence length
  Heads,          ///< costs: its attention heads
  Vocab,          ///< costs: its vocabulary
  MicroBatch,     ///< costs: the rows of a micro-batch
  DeviceTflops,   ///< costs: a device's peak
  Bandwidth,      ///< costs: the link's bandwidth
  BytesPerValue,  ///< costs: the bytes of one value
};

/// The option's own name: "override", "checkpoint_dir", "resume", ...
const char* option_name(Option o);

/// The option as a message names it: a marker ("<option:resume>") that render_options replaces.
std::string option(Option o);

/// `text` with every option marker replaced by spell(option); a marker of no known option stays.
std::string render_options(const std::string& text, const std::function<std::string(Option)>& spell);

}  // namespace pipetrain
