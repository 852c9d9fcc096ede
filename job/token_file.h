// A flat file of token ids (data.kind tokens, job/tokens_data.h) mapped as stored: a raw `.bin`
// of little-endian ids (data.dtype: uint16 by default, uint32, uint8, int32, int64), or a 1-D `.npy` of uint8, uint16, uint32, int32 or
// int64 (job/npy.h reads its header). Apart from the data set so that the fuzz target
// (fuzz/token_file_fuzz.cpp) reaches it alone. Tests: tests/tokens_data_test.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>

#include "job/choices.h"

namespace pipetrain::job {

// A token file mapped: `ids` [n] as stored (uint16 held as int16 and uint32 as int32, which
// libtorch indexes; `mask` clears the sign bits when they are widened; 0 for the other types).
struct TokenFile {
  std::string file;
  at::Tensor ids;
  int64_t mask = 0;
  int64_t offset = 0;   // bytes before the first id (an .npy header)
  int64_t itemsize = 1;
};

// Maps `file`: a `.npy` by its header (`dtype`, if set, must agree), anything else as raw
// ids of `dtype` (unset: uint16). DataError naming the file on any problem.
TokenFile read_token_file(const std::string& file, std::optional<TokenDType> dtype);

// `ids` (of a TokenFile) as int64, the sign bits of uint16/uint32 ids cleared by `mask`.
at::Tensor widen_ids(const at::Tensor& ids, int64_t mask);

}  // namespace pipetrain::job
