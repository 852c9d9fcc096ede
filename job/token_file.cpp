// Token files mapped as stored (job/token_file.h).
#include "job/token_file.h"

#include <torch/torch.h>

#include "common/error.h"
#include "common/strings.h"
#include "job/npy.h"

namespace pipetrain::job {

namespace {

// How ids are stored, one row per type: libtorch indexes int16/int32 but not uint16/uint32, so
// those are held signed and masked when widened.
struct TokenType {
  const char* descr;  // the .npy header's spelling
  TokenDType type;    // data.dtype's (its name: job/choices.cpp)
  at::ScalarType stored;
  int64_t mask;
};
const TokenType kTypes[] = {{"'<u2'", TokenDType::Uint16, at::kShort, 0xFFFF},
                            {"'<u4'", TokenDType::Uint32, at::kInt, 0xFFFFFFFFLL},
                            {"'|u1'", TokenDType::Uint8, at::kByte, 0},
                            {"'<u1'", TokenDType::Uint8, at::kByte, 0},
                            {"'<i4'", TokenDType::Int32, at::kInt, 0},
                            {"'<i8'", TokenDType::Int64, at::kLong, 0}};

[[noreturn]] void bad(const std::string& file, const std::string& what) { throw DataError(printable(file, 300) + ": " + what); }

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

TokenFile read_token_file(const std::string& file, std::optional<TokenDType> dtype) {
  TokenFile t;
  t.file = file;
  const TokenType* type = nullptr;
  int64_t count = 0;
  if (ends_with(file, ".npy")) {
    const NpyHeader h = read_npy_header(file);
    for (const auto& row : kTypes)
      if (h.descr == row.descr) type = &row;
    if (!type) bad(file, "holds dtype " + h.descr + "; token ids are read as uint8, uint16, uint32, int32 or int64 (little-endian)");
    if (dtype && *dtype != type->type)
      bad(file, std::string("holds ") + choice_name(type->type) + " ids (its header), but data.dtype says " +
                    choice_name(*dtype));
    if (h.shape.size() != 1)
      bad(file, "an array of " + std::to_string(h.shape.size()) + " dimensions; token ids are one flat array (numpy's ravel)");
    count = h.count;
    t.offset = h.offset;
    t.itemsize = static_cast<int64_t>(c10::elementSize(type->stored));
    if (h.file_size < t.offset + count * t.itemsize)
      bad(file, detail::concat("truncated: ", h.file_size, " bytes, its header describes ", t.offset + count * t.itemsize));
  } else {
    const TokenDType want = dtype.value_or(TokenDType::Uint16);
    for (const auto& row : kTypes)
      if (!type && want == row.type) type = &row;
    const char* name = choice_name(want);
    PIPETRAIN_CHECK(type, "data.dtype ", name);
    t.itemsize = static_cast<int64_t>(c10::elementSize(type->stored));
    const int64_t size = regular_file_size(file);
    if (size % t.itemsize != 0)
      bad(file, detail::concat(size, " bytes are not a whole number of ", name, " ids (", t.itemsize,
                               " bytes each; data.dtype says which)"));
    count = size / t.itemsize;
  }
  t.mask = type->mask;
  t.ids = map_file(file, t.offset, {count}, type->stored);
  return t;
}

at::Tensor widen_ids(const at::Tensor& ids, int64_t mask) {
  at::Tensor v = ids.to(at::kLong);
  return mask ? v.bitwise_and_(mask) : v;
}

}  // namespace pipetrain::job
