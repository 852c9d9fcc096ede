#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include <torch/torch.h>

#include "common/error.h"
#include "job/data.h"
#include "train/trainer.h"

using namespace pipetrain;
using namespace pipetrain::pipeline;
using namespace pipetrain::job;
using namespace pipetrain::train;

namespace {
std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/pipetrain_" + std::to_string(::getpid()) + "_" + name;
}
void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  if (!bytes.empty()) gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}
std::string idx_error(const std::vector<uint8_t>& bytes) {
  const std::string p = temp_path("bad.gz");
  write_gz(p, bytes);
  try {
    read_idx(p);
  } catch (const DataError& e) {
    std::remove(p.c_str());
    return e.what();
  }
  std::remove(p.c_str());
  return "";
}
}  // namespace

TEST(Idx, ReadsAValidFile) {
  const std::string p = temp_path("ok.gz");
  write_gz(p, {0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6});
  auto t = read_idx(p);
  std::remove(p.c_str());
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.sum().item<int64_t>(), 21);
}

TEST(Idx, RefusesBadFilesWithTheFileName) {
  EXPECT_NE(idx_error({}).find("truncated"), std::string::npos);
  EXPECT_NE(idx_error({1, 2, 3, 4}).find("bad magic"), std::string::npos);
  EXPECT_NE(idx_error({0, 0, 8, 9}).find("9 dims"), std::string::npos);
  EXPECT_NE(idx_error({0, 0, 8, 1, 0, 0, 0, 10, 1, 2}).find("truncated or corrupt while reading the data"),
            std::string::npos);
  EXPECT_NE(idx_error({0, 0, 8, 1}).find("pipetrain_"), std::string::npos);  // names the file
  EXPECT_THROW(read_idx("/nonexistent.gz"), DataError);
}

namespace {
Config config_for(nlohmann::json model, nlohmann::json data) {
  return parse_config({{"model", model}, {"data", data}}, "t.json");
}
}  // namespace

TEST(Synthetic, DeterministicLearnableAndShaped) {
  Config c = config_for({{"family", "gpt"}, {"vocab_size", 13}, {"seq_len", 5}, {"d_model", 8}, {"n_heads", 2}},
                        {{"kind", "synthetic"}, {"samples", 40}, {"test_samples", 8}, {"batch_size", 4}});
  Job a = prepare(c), b = prepare(c);
  auto x = a.data.train_batch(3, 4, 0), y = b.data.train_batch(3, 4, 0);
  EXPECT_TRUE(torch::equal(x.input, y.input));
  EXPECT_EQ(x.input.sizes(), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(x.target.sizes(), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(x.input.scalar_type(), torch::kLong);
  // Targets are the inputs shifted by one token.
  EXPECT_TRUE(torch::equal(x.input.narrow(1, 1, 4), x.target.narrow(1, 0, 4)));
  EXPECT_EQ(a.data.test.size(), 8);

  Config m = config_for({{"family", "mlp"}, {"in", 6}, {"out", 3}},
                        {{"kind", "synthetic"}, {"samples", 40}, {"test_samples", 8}, {"batch_size", 4}});
  Job j = prepare(m);
  EXPECT_EQ(j.data.train_batch(0, 4, 0).input.sizes(), (std::vector<int64_t>{4, 6}));
  EXPECT_LT(j.data.train.targets.max().item<int64_t>(), 3);
}

TEST(Batches, EpochsAreShuffledPermutations) {
  Config c = config_for({{"family", "mlp"}, {"in", 2}, {"out", 2}},
                        {{"kind", "synthetic"}, {"samples", 12}, {"test_samples", 5}, {"batch_size", 4}});
  Job j = prepare(c);
  // One epoch = 3 batches covering every sample once.
  std::vector<at::Tensor> seen;
  for (int s = 0; s < 3; ++s) seen.push_back(j.data.train_batch(s, 4, 0).input);
  auto all = torch::cat(seen);
  EXPECT_TRUE(torch::equal(std::get<0>(all.sum(1).sort()), std::get<0>(j.data.train.inputs.sum(1).sort())));
  EXPECT_EQ(j.data.test_batches(4), 2);
  EXPECT_EQ(j.data.test_batch(1, 4).input.size(0), 1);
}

TEST(FashionMnist, LoadsTheDebianPackageFiles) {
  const char* dir = "/usr/share/datasets/fashion-mnist";
  if (!std::ifstream(std::string(dir) + "/t10k-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  Config c = config_for({{"family", "cnn"}}, {{"kind", "fashion-mnist"}, {"batch_size", 32}});
  Job j = prepare(c);
  EXPECT_EQ(j.data.train.size(), 60000);
  EXPECT_EQ(j.data.test.size(), 10000);
  auto b = j.data.train_batch(0, 32, 0);
  EXPECT_EQ(b.input.sizes(), (std::vector<int64_t>{32, 1, 28, 28}));
  EXPECT_EQ(b.input.scalar_type(), torch::kFloat);
  EXPECT_NEAR(j.data.test_batch(0, 10000).input.mean().item<double>(), 0.0, 0.05);  // normalised
}

namespace {
std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string p = temp_path(name);
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}
nlohmann::json byte_gpt(int64_t seq_len, int64_t vocab = 256) {
  return {{"family", "gpt"}, {"vocab_size", vocab}, {"seq_len", seq_len},
          {"d_model", 8},    {"n_heads", 2},        {"n_layers", 1}};
}
template <typename E>
std::string prepare_error(const nlohmann::json& model, const nlohmann::json& data) {
  try {
    prepare(config_for(model, data));
  } catch (const E& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Text, WindowsFollowTheFileAndSplitIt) {
  // Byte i is 37 i mod 256, so each byte is followed by itself + 37 (every byte value occurs).
  constexpr int kStep = 37;
  std::string bytes;
  for (int i = 0; i < 700; ++i) bytes.push_back(static_cast<char>((i * kStep) % 256));
  const std::string path = write_file("windows.bin", bytes);
  const int64_t T = 8, stride = 3, B = 4;
  const double fraction = 0.2;
  Job j = prepare(config_for(byte_gpt(T), {{"kind", "text"},
                                           {"path", path},
                                           {"batch_size", B},
                                           {"stride", stride},
                                           {"test_fraction", fraction}}));
  Job again = prepare(config_for(byte_gpt(T), {{"kind", "text"},
                                               {"path", path},
                                               {"batch_size", B},
                                               {"stride", stride},
                                               {"test_fraction", fraction}}));
  std::remove(path.c_str());

  const int64_t n = static_cast<int64_t>(bytes.size());
  const int64_t test_len = std::llround(static_cast<double>(n) * fraction), train_len = n - test_len;
  EXPECT_EQ(j.data.train.size(), (train_len - (T + 1)) / stride + 1);
  EXPECT_EQ(j.data.test.size(), (test_len - (T + 1)) / T + 1);
  EXPECT_EQ(j.data.name, "text");
  auto byte = [&](int64_t i) { return static_cast<int64_t>(static_cast<unsigned char>(bytes.at(i))); };
  auto check_split = [&](const Split& s, int64_t begin, int64_t step, int64_t end) {
    const auto in = s.inputs.to(torch::kLong), tg = s.targets.to(torch::kLong);
    for (int64_t i = 0; i < s.size(); ++i) {
      const int64_t start = begin + i * step;
      ASSERT_LE(start + T + 1, end);  // a window never reaches into the other split
      for (int64_t t = 0; t < T; ++t) {
        ASSERT_EQ(in[i][t].item<int64_t>(), byte(start + t));
        ASSERT_EQ(tg[i][t].item<int64_t>(), byte(start + t + 1));
      }
    }
  };
  check_split(j.data.train, 0, stride, train_len);
  check_split(j.data.test, train_len, T, n);

  for (int64_t step : {0, 5, 13}) {
    const Batch b = j.data.train_batch(step, B, 3);
    EXPECT_EQ(b.input.scalar_type(), torch::kLong);
    EXPECT_EQ(b.target.scalar_type(), torch::kLong);
    EXPECT_EQ(b.input.sizes(), (std::vector<int64_t>{B, T}));
    EXPECT_TRUE(torch::equal(b.target.narrow(1, 0, T - 1), b.input.narrow(1, 1, T - 1)));
    EXPECT_TRUE(torch::equal(b.target, (b.input + kStep) % 256));  // the file's next byte
    EXPECT_TRUE(
        torch::equal(b.input, again.data.train_batch(step, B, 3).input));  // a function of (step, seed)
  }
  const Batch last = j.data.test_batch(j.data.test_batches(B) - 1, B);
  EXPECT_EQ(last.input.size(0), j.data.test.size() - (j.data.test_batches(B) - 1) * B);
  EXPECT_TRUE(torch::equal(last.target, (last.input + kStep) % 256));
}

TEST(Text, StrideDefaultsToSeqLen) {
  const std::string path = write_file("stride.txt", std::string(300, 'x'));
  const int64_t T = 10;
  Job j = prepare(config_for(byte_gpt(T), {{"kind", "text"}, {"path", path}, {"batch_size", 2}}));
  std::remove(path.c_str());
  const int64_t test_len = std::llround(300 * 0.1), train_len = 300 - test_len;
  EXPECT_EQ(j.data.train.size(), (train_len - (T + 1)) / T + 1);
}

TEST(Text, BaselineIsTheUnigramCrossEntropyOfTheTestTargets) {
  // Train "aaab", test "xab"; with seq_len 1 the test windows are "xa" and "ab", so the targets
  // are 'a' (3 of the 4 training bytes) and 'b' (1 of 4); add-one smoothing over 256 values.
  const std::string path = write_file("baseline.txt", "aaabxab");
  Job j = prepare(config_for(
      byte_gpt(1), {{"kind", "text"}, {"path", path}, {"batch_size", 2}, {"test_fraction", 3.0 / 7.0}}));
  std::remove(path.c_str());
  ASSERT_EQ(j.data.test.size(), 2);
  EXPECT_EQ(j.data.baseline_name, "unigram");
  const double expected = -(std::log((3.0 + 1) / (4 + 256)) + std::log((1.0 + 1) / (4 + 256))) / 2;
  EXPECT_NEAR(j.data.baseline_loss, expected, 1e-12);

  auto t = [](const std::string& s) {
    return torch::from_blob(const_cast<char*>(s.data()), {static_cast<int64_t>(s.size())}, torch::kUInt8)
        .clone();
  };
  EXPECT_NEAR(unigram_loss(t("aab"), t("ab")), -(std::log(3.0 / 259) + std::log(2.0 / 259)) / 2, 1e-12);
  EXPECT_NEAR(unigram_loss(t(""), t("z")), std::log(256.0), 1e-12);  // no training bytes: uniform

  Job s = prepare(config_for(
      byte_gpt(4), {{"kind", "synthetic"}, {"samples", 8}, {"test_samples", 2}, {"batch_size", 2}}));
  EXPECT_EQ(s.data.baseline_loss, 0);
  EXPECT_EQ(s.data.baseline_name, "");
}

TEST(Text, ErrorsNameTheFileOrTheKeyOnOneLine) {
  const std::string missing = temp_path("missing.txt");
  auto expect = [&](const std::string& msg, const std::vector<std::string>& parts) {
    for (const auto& part : parts)
      EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  };
  expect(prepare_error<DataError>(byte_gpt(8), {{"kind", "text"}, {"path", missing}}),
         {missing, "cannot open"});
  const std::string dir = ::testing::TempDir();
  expect(prepare_error<DataError>(byte_gpt(8), {{"kind", "text"}, {"path", dir}}),
         {dir, "not a regular file"});

  // 40 bytes with seq_len 8: a window needs 9 bytes, the default 10% test split has 4.
  const std::string shorty = write_file("short.txt", std::string(40, 'a'));
  expect(prepare_error<DataError>(byte_gpt(8), {{"kind", "text"}, {"path", shorty}, {"batch_size", 1}}),
         {shorty, "too short", "model.seq_len + 1 = 9"});
  expect(prepare_error<DataError>(
             byte_gpt(8), {{"kind", "text"}, {"path", shorty}, {"batch_size", 1}, {"test_fraction", 0.9}}),
         {shorty, "too short"});
  expect(prepare_error<ConfigError>({{"family", "mlp"}}, {{"kind", "text"}, {"path", shorty}}),
         {"model.family", "gpt"});
  expect(prepare_error<ConfigError>(byte_gpt(8, 64), {{"kind", "text"}, {"path", shorty}}),
         {"model.vocab_size", "256"});
  std::remove(shorty.c_str());
  expect(prepare_error<ConfigError>(byte_gpt(8), {{"kind", "text"}}), {"data.path", "required"});
  expect(
      prepare_error<ConfigError>(byte_gpt(8), {{"kind", "text"}, {"path", missing}, {"test_fraction", 1.0}}),
      {"data.test_fraction"});
  expect(prepare_error<ConfigError>(byte_gpt(8), {{"kind", "text"}, {"path", missing}, {"stride", -1}}),
         {"data.stride"});
}
