// The index of a sharded safetensors checkpoint (model.safetensors.index.json, models/safetensors.h)
// as a damaged or forged file would reach the reader, beside two real shards: the checkpoint opens
// (and then every name reads from the file the map gives) or the reader refuses it with a
// SafetensorsError, nothing else. The shards hold a.0, a.1 (model-00001-of-00002.safetensors) and
// b.0 (model-00002-of-00002.safetensors); the seed corpus maps them right and wrong.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <torch/torch.h>

#include "models/safetensors.h"

namespace {

std::string folder;

void remove_folder() { std::filesystem::remove_all(folder); }

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  folder = std::filesystem::temp_directory_path().string() + "/safetensors_index_fuzz." + std::to_string(::getpid());
  std::filesystem::create_directories(folder);
  std::atexit(remove_folder);
  pipetrain::models::save_safetensors(folder + "/model-00001-of-00002.safetensors",
                                      {{"a.0", torch::arange(4, torch::kFloat)}, {"a.1", torch::ones({2, 2}, torch::kLong)}});
  pipetrain::models::save_safetensors(folder + "/model-00002-of-00002.safetensors", {{"b.0", torch::zeros({3}, torch::kBFloat16)}});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::ofstream out(folder + "/model.safetensors.index.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const pipetrain::models::SafetensorsCheckpoint checkpoint(folder);
    for (const auto& name : checkpoint.names())
      if (!checkpoint.get(name).defined() || checkpoint.file_of(name).empty()) __builtin_trap();
  } catch (const pipetrain::models::SafetensorsError&) {
  }
  return 0;
}
