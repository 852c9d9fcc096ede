// Checkpoint manifests. A manifest that check_manifest accepts must be readable the way the
// loader reads it (every field with its type, shard entries whole), with no JSON exception.
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/manifest.h"

using pipetrain::checkpoint::CheckpointError;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  nlohmann::json m;
  try {
    m = pipetrain::checkpoint::check_manifest(text, "fuzz/manifest.json", "step-00000002");
  } catch (const CheckpointError&) {
    return 0;
  }
  // What load_checkpoint and read_shards then read.
  (void)m.at("step").get<int64_t>();
  (void)m.at("batches").get<int64_t>();
  (void)m.at("pipeline_step").get<int64_t>();
  const int64_t stages = m.at("stages").get<int64_t>();
  if (stages < 1 || stages > 4096) std::abort();
  for (const auto& s : m.at("shards")) {
    (void)s.at("file").get<std::string>();
    (void)s.at("bytes").get<uint64_t>();
    (void)s.at("crc32").get<uint32_t>();
  }
  (void)m.at("identity").dump();
  return 0;
}
