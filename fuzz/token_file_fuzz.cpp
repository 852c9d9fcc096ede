// Token files (job/token_file.h: a raw .bin, or an .npy whose header job/npy.h reads) as a damaged
// or forged file would reach the data set: mapped ids or a DataError, nothing else. The first byte
// picks the kind and data.dtype (none, or one of the five types, for a .npy or a .bin); the
// rest is the file. Every id the reader maps is then read here, instrumented, and must lie within
// the file's bytes after its header.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "common/error.h"
#include "job/token_file.h"

namespace {

std::string folder;

void remove_folder() { std::filesystem::remove_all(folder); }

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  folder = std::filesystem::temp_directory_path().string() + "/token_file_fuzz." + std::to_string(::getpid());
  std::filesystem::create_directories(folder);
  std::atexit(remove_folder);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using pipetrain::job::TokenDType;
  static const std::optional<TokenDType> kDtypes[] = {std::nullopt, TokenDType::Uint16, TokenDType::Uint32,
                                                      TokenDType::Uint8, TokenDType::Int32, TokenDType::Int64};
  const bool npy = data[0] % 2 == 0;
  const std::optional<TokenDType> dtype = kDtypes[(data[0] / 2) % 6];
  const std::string file = folder + (npy ? "/ids.npy" : "/ids.bin");
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  }
  try {
    const pipetrain::job::TokenFile t = pipetrain::job::read_token_file(file, dtype);
    const int64_t bytes = t.ids.numel() * t.itemsize;
    if (t.ids.dim() != 1 || t.offset < 0 || t.offset + bytes > static_cast<int64_t>(size - 1)) __builtin_trap();
    unsigned sum = 0;
    const auto* p = static_cast<const unsigned char*>(t.ids.data_ptr());
    for (int64_t i = 0; i < bytes; ++i) sum += p[i];
    (void)sum;
    if (t.ids.numel() > 0 && pipetrain::job::widen_ids(t.ids, t.mask).min().item<int64_t>() < (t.mask ? 0 : INT64_MIN))
      __builtin_trap();
  } catch (const pipetrain::DataError&) {
  }
  std::filesystem::remove(file);
  return 0;
}
