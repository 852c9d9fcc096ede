// data.kind "tokens": flat files of token ids, mapped and cut into windows (job/tokens_data.h).
#include "job/tokens_data.h"

#include <algorithm>
#include <cmath>

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
  const char* name;   // data.dtype's and the messages'
  at::ScalarType stored;
  int64_t mask;
};
const TokenType kTypes[] = {{"'<u2'", "uint16", at::kShort, 0xFFFF},      {"'<u4'", "uint32", at::kInt, 0xFFFFFFFFLL},
                            {"'|u1'", "uint8", at::kByte, 0},              {"'<u1'", "uint8", at::kByte, 0},
                            {"'<i4'", "int32", at::kInt, 0},               {"'<i8'", "int64", at::kLong, 0}};

[[noreturn]] void bad(const std::string& file, const std::string& what) { throw DataError(printable(file, 300) + ": " + what); }

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

at::Tensor widen(const at::Tensor& ids, int64_t mask) {
  at::Tensor v = ids.to(at::kLong);
  return mask ? v.bitwise_and_(mask) : v;
}

// Reads ids [begin, end) of `t` once, in chunks: each must lie in [0, vocab); counted into `counts`
// when given.
void check_ids(const TokenFile& t, int64_t begin, int64_t end, int64_t vocab, at::Tensor* counts) {
  constexpr int64_t kChunk = int64_t{1} << 22;
  for (int64_t at = begin; at < end; at += kChunk) {
    const at::Tensor v = widen(t.ids.narrow(0, at, std::min(kChunk, end - at)), t.mask);
    if (v.min().item<int64_t>() < 0 || v.max().item<int64_t>() >= vocab) {
      const int64_t i = torch::nonzero(v.lt(0).logical_or(v.ge(vocab)))[0][0].item<int64_t>();
      const int64_t id = v[i].item<int64_t>(), index = at + i;
      bad(t.file, detail::concat("token id ", id, " at byte offset ", t.offset + index * t.itemsize, " (id number ", index,
                                 ") is ", id < 0 ? "negative" : "not below model.vocab_size " + std::to_string(vocab)));
    }
    if (counts) *counts += torch::bincount(v, {}, vocab);
  }
}

// Windows of seq_len + 1 ids over [begin, begin + len) of `t`, one every `step`: overlapping views
// of the mapped file, nothing copied.
Split windows(const TokenFile& t, int64_t begin, int64_t len, int64_t step, int64_t seq_len) {
  const int64_t rows = (len - seq_len - 1) / step + 1, offset = t.ids.storage_offset() + begin;
  return Split{t.ids.as_strided({rows, seq_len}, {step, 1}, offset), t.ids.as_strided({rows, seq_len}, {step, 1}, offset + 1)};
}

}  // namespace

TokenFile read_token_file(const std::string& file, const std::string& dtype) {
  TokenFile t;
  t.file = file;
  const TokenType* type = nullptr;
  int64_t count = 0;
  if (ends_with(file, ".npy")) {
    const NpyHeader h = read_npy_header(file);
    for (const auto& row : kTypes)
      if (h.descr == row.descr) type = &row;
    if (!type) bad(file, "holds dtype " + h.descr + "; token ids are read as uint8, uint16, uint32, int32 or int64 (little-endian)");
    if (!dtype.empty() && dtype != type->name)
      bad(file, std::string("holds ") + type->name + " ids (its header), but data.dtype says " + dtype);
    if (h.shape.size() != 1)
      bad(file, "an array of " + std::to_string(h.shape.size()) + " dimensions; token ids are one flat array (numpy's ravel)");
    count = h.count;
    t.offset = h.offset;
    t.itemsize = static_cast<int64_t>(c10::elementSize(type->stored));
    if (h.file_size < t.offset + count * t.itemsize)
      bad(file, detail::concat("truncated: ", h.file_size, " bytes, its header describes ", t.offset + count * t.itemsize));
  } else {
    const std::string name = dtype.empty() ? "uint16" : dtype;
    for (const auto& row : kTypes)
      if (!type && name == row.name) type = &row;
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

Dataset load_tokens(const Config& c, const models::Model& model) {
  if (!model.token_input || model.sample_shape.size() != 1)
    throw ConfigError(c.where("data.kind") +
                      ": data.kind tokens needs a model that takes a sequence of token ids (the gpt family, or a "
                      "layer list that starts with an embedding)");
  const int64_t seq_len = model.sample_shape[0], vocab = model.classes, window = seq_len + 1;
  const int64_t stride = c.data.stride > 0 ? c.data.stride : seq_len;
  const TokenFile train = read_token_file(c.data.path, c.data.dtype);
  const int64_t n = train.ids.numel();
  TokenFile test = train;
  int64_t train_len = n, test_begin = 0, test_len = 0;
  if (c.data.test_path.empty()) {
    test_len = std::llround(static_cast<double>(n) * c.data.test_fraction);
    train_len = test_begin = n - test_len;
    if (train_len < window || test_len < window)
      bad(c.data.path, detail::concat("too short: its ", n, " ids give ", train_len, " for training and ", test_len,
                                      " for testing (data.test_fraction ", c.data.test_fraction,
                                      ") but a window needs model.seq_len + 1 = ", window, " ids in each"));
  } else {
    test = read_token_file(c.data.test_path, c.data.dtype);
    test_len = test.ids.numel();
    for (const auto& [file, len] : {std::pair{c.data.path, n}, std::pair{c.data.test_path, test_len}})
      if (len < window)
        bad(file, detail::concat("too short: ", len, " ids, but a window needs model.seq_len + 1 = ", window));
  }
  at::Tensor counts = torch::zeros({vocab}, at::kLong);
  check_ids(train, 0, train_len, vocab, &counts);
  check_ids(test, test_begin, test_begin + test_len, vocab, nullptr);
  Dataset d;
  d.name = "tokens";
  d.sample_shape = {seq_len};
  d.classes = vocab;
  d.tokens = true;
  d.train = windows(train, 0, train_len, stride, seq_len);
  d.test = windows(test, test_begin, test_len, seq_len, seq_len);
  d.train_token_mask = train.mask;
  d.test_token_mask = test.mask;
  // Unigram baseline: each test target predicted by the training ids' frequencies (add-one), in
  // nats per token. Test targets are the contiguous ids after each test window's first.
  const int64_t targets = d.test.size() * seq_len;
  const at::Tensor test_counts =
      torch::bincount(widen(test.ids.narrow(0, test_begin + 1, targets), test.mask), {}, vocab).to(at::kDouble);
  const at::Tensor log_p = ((counts.to(at::kDouble) + 1.0) / (static_cast<double>(train_len) + vocab)).log();
  d.baseline_name = "unigram";
  d.baseline_loss = -(test_counts * log_p).sum().item<double>() / static_cast<double>(targets);
  return d;
}

}  // namespace pipetrain::job
