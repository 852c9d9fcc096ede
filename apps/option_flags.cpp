// The run options' flags (option_flags.h).
#include "apps/option_flags.h"

namespace pipetrain::apps {

const char* flag_of(Option o) {
  switch (o) {
    case Option::Override: return "--set";
    case Option::CheckpointDir: return "--checkpoint-dir";
    case Option::Resume: return "--resume";
    case Option::UntilStep: return "--until-step";
    case Option::Metrics: return "--metrics";
    case Option::Trace: return "--trace";
    case Option::TensorBoard: return "--tensorboard";
    case Option::Devices: return "--devices";
    case Option::Cores: return "--cores";
    case Option::MemoryLimit: return "--memory-limit";
    case Option::Speeds: return "--speeds";
    case Option::WriteConfig: return "--write-config";
    case Option::Efficiency: return "--efficiency";
    case Option::LatencyMs: return "--latency-ms";
    case Option::Layers: return "--layers";
    case Option::Hidden: return "--hidden";
    case Option::Seq: return "--seq";
    case Option::Heads: return "--heads";
    case Option::Vocab: return "--vocab";
    case Option::MicroBatch: return "--micro-batch";
    case Option::DeviceTflops: return "--device-tflops";
    case Option::Bandwidth: return "--bandwidth";
    case Option::BytesPerValue: return "--bytes-per-value";
  }
  return "--?";
}

std::string with_flags(const std::string& text) {
  return render_options(text, [](Option o) { return std::string(flag_of(o)); });
}

}  // namespace pipetrain::apps
