// safetensors files (models/safetensors.h) as a damaged or forged file would reach the reader: a
// checked header or a SafetensorsError, nothing else. The bytes of every entry the checks let
// through are then read here, instrumented, from a buffer of exactly the input's size, so an
// offset past the end is a heap overflow that AddressSanitizer reports; each entry's shape must
// account for exactly its bytes; and the tensors, written again by our writer, must read back the
// same (names, types, shapes and bytes).
#include <cstdint>
#include <cstring>
#include <vector>

#include <torch/torch.h>

#include "models/safetensors.h"

namespace {

using pipetrain::models::SafetensorsHeader;

uint64_t bytes_of(const pipetrain::models::SafetensorsEntry& e) {
  uint64_t n = c10::elementSize(e.type);
  for (int64_t d : e.shape) n *= static_cast<uint64_t>(d);
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<char> file(reinterpret_cast<const char*>(data), reinterpret_cast<const char*>(data) + size);
  SafetensorsHeader h;
  try {
    h = pipetrain::models::parse_safetensors(file.data(), file.size(), "fuzz.safetensors");
  } catch (const pipetrain::models::SafetensorsError&) {
    return 0;
  }
  pipetrain::models::NamedTensors tensors;
  for (const auto& e : h.entries) {
    if (bytes_of(e) != e.end - e.begin) __builtin_trap();
    unsigned sum = 0;
    for (uint64_t i = e.begin; i < e.end; ++i) sum += static_cast<unsigned char>(file[h.data_start + i]);
    (void)sum;
    at::Tensor t = torch::empty(e.shape, at::TensorOptions().dtype(e.type));
    if (e.end > e.begin) std::memcpy(t.data_ptr(), file.data() + h.data_start + e.begin, e.end - e.begin);
    tensors.emplace_back(e.name, t);
  }
  // Our writer on what the reader accepted: the same tensors back.
  std::string again;
  try {
    again = pipetrain::models::safetensors_bytes(tensors, h.metadata, "fuzz-again.safetensors");
  } catch (const pipetrain::models::SafetensorsError&) {
    return 0;  // names or metadata the JSON writer refuses (never UTF-8 that the reader accepted)
  }
  const SafetensorsHeader back = pipetrain::models::parse_safetensors(again.data(), again.size(), "fuzz-again.safetensors");
  if (back.entries.size() != h.entries.size() || back.metadata != h.metadata) __builtin_trap();
  for (const auto& e : h.entries) {
    const auto* b = back.find(e.name);
    if (!b || b->type != e.type || b->shape != e.shape ||
        std::memcmp(again.data() + back.data_start + b->begin, file.data() + h.data_start + e.begin, e.end - e.begin) != 0)
      __builtin_trap();
  }
  return 0;
}
