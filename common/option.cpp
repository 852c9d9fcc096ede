// Run options named by id in messages (option.h).
#include "common/option.h"

#include <array>
#include <utility>

namespace pipetrain {

namespace {

constexpr const char* kOpen = "<option:";

constexpr std::array<std::pair<Option, const char*>, 23> kNames{{
    {Option::Override, "override"},
    {Option::CheckpointDir, "checkpoint_dir"},
    {Option::Resume, "resume"},
    {Option::UntilStep, "until_step"},
    {Option::Metrics, "metrics"},
    {Option::Trace, "trace"},
    {Option::TensorBoard, "tensorboard"},
    {Option::Devices, "devices"},
    {Option::Cores, "cores"},
    {Option::MemoryLimit, "memory_limit"},
    {Option::Speeds, "speeds"},
    {Option::WriteConfig, "write_config"},
    {Option::Efficiency, "efficiency"},
    {Option::LatencyMs, "latency_ms"},
    {Option::Layers, "layers"},
    {Option::Hidden, "hidden"},
    {Option::Seq, "seq"},
    {Option::Heads, "heads"},
    {Option::Vocab, "vocab"},
    {Option::MicroBatch, "micro_batch"},
    {Option::DeviceTflops, "device_tflops"},
    {Option::Bandwidth, "bandwidth"},
    {Option::BytesPerValue, "bytes_per_value"},
}};

}  // namespace

const char* option_name(Option o) {
  for (const auto& [id, name] : kNames)
    if (id == o) return name;
  return "option";
}

std::string option(Option o) { return std::string(kOpen) + option_name(o) + ">"; }

std::string render_options(const std::string& text, const std::function<std::string(Option)>& spell) {
  std::string out;
  size_t at = 0;
  for (;;) {
    const size_t open = text.find(kOpen, at);
    if (open == std::string::npos) break;
    const size_t close = text.find('>', open);
    if (close == std::string::npos) break;
    const std::string name = text.substr(open + 8, close - open - 8);
    out += text.substr(at, open - at);
    bool known = false;
    for (const auto& [id, n] : kNames)
      if (name == n) {
        out += spell(id);
        known = true;
        break;
      }
    if (!known) out += text.substr(open, close + 1 - open);
    at = close + 1;
  }
  return out + text.substr(at);
}

}  // namespace pipetrain
