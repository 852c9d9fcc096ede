#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <fstream>

#include <torch/torch.h>

#include "common/error.h"
#include "pipeline/data.h"
#include "pipeline/trainer.h"

using namespace pipetrain;
using namespace pipetrain::pipeline;

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
