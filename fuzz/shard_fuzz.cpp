// Checkpoint shards (torch.save archives of named tensors) after the manifest's size and CRC
// checks, as a damaged or forged file would reach the loader: a dict of named tensors or a
// CheckpointError. libtorch's own reader runs uninstrumented inside.
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<char> bytes(reinterpret_cast<const char*>(data), reinterpret_cast<const char*>(data) + size);
  try {
    for (const auto& [name, tensor] : pipetrain::checkpoint::load_tensor_dict(bytes, "fuzz/stage-0.pt"))
      (void)tensor.numel();
  } catch (const pipetrain::checkpoint::CheckpointError&) {
  }
  return 0;
}
