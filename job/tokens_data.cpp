// data.kind "tokens": flat files of token ids, mapped and cut into windows (job/tokens_data.h).
#include "job/tokens_data.h"

#include <algorithm>
#include <cmath>

#include <torch/torch.h>

#include "common/error.h"
#include "common/strings.h"
#include "job/token_file.h"

namespace pipetrain::job {

namespace {

[[noreturn]] void bad(const std::string& file, const std::string& what) { throw DataError(printable(file, 300) + ": " + what); }

// Reads ids [begin, end) of `t` once, in chunks: each must lie in [0, vocab); counted into `counts`
// when given.
void check_ids(const TokenFile& t, int64_t begin, int64_t end, int64_t vocab, at::Tensor* counts) {
  constexpr int64_t kChunk = int64_t{1} << 22;
  for (int64_t at = begin; at < end; at += kChunk) {
    const at::Tensor v = widen_ids(t.ids.narrow(0, at, std::min(kChunk, end - at)), t.mask);
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
      torch::bincount(widen_ids(test.ids.narrow(0, test_begin + 1, targets), test.mask), {}, vocab).to(at::kDouble);
  const at::Tensor log_p = ((counts.to(at::kDouble) + 1.0) / (static_cast<double>(train_len) + vocab)).log();
  d.baseline_name = "unigram";
  d.baseline_loss = -(test_counts * log_p).sum().item<double>() / static_cast<double>(targets);
  return d;
}

}  // namespace pipetrain::job
