// data.kind "tokens" (job/tokens_data.h): flat files of token ids, raw .bin (uint16, uint32) and
// .npy written by numpy, cut into windows whose inputs and targets are exactly the file's ids
// (the target the input shifted by one), split by a second file or a fraction, drawn in the same
// order from the same seed; every bad file or config refused in one line naming the file (and the
// byte offset of a bad id); and a gpt model trained on a tokens file through the command line.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include <torch/torch.h>

#include "common/error.h"
#include "job/config.h"
#include "job/data.h"
#include "job/job.h"
#include "job/tokens_data.h"
#include "tests/cli_helpers.h"

using namespace pipetrain;

namespace {

std::string dir() {
  static const std::string d = [] {
    const std::string p = ::testing::TempDir() + "/pipetrain_tokens_" + std::to_string(::getpid());
    std::filesystem::remove_all(p);  // an earlier process of the same id may have left its files (a FIFO)
    std::filesystem::create_directories(p);
    return p;
  }();
  return d;
}

template <typename T>
std::string write_bin(const std::string& name, const std::vector<T>& ids) {
  const std::string path = dir() + "/" + name;
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(T));
  return path;
}

void python(const std::string& code) {
  const std::string script = dir() + "/make.py";
  std::ofstream(script) << code;
  const auto r = test::shell(std::string(PIPETRAIN_PYTHON) + " " + script + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
}

std::string gpt(int64_t vocab, int64_t seq_len) {
  return R"({"family": "gpt", "vocab_size": )" + std::to_string(vocab) + R"(, "seq_len": )" + std::to_string(seq_len) +
         R"(, "d_model": 8, "n_heads": 2, "n_layers": 1, "dropout": 0.0})";
}

job::Config config(const std::string& model, const std::string& data) {
  return job::parse_config(nlohmann::json::parse(R"({"model": )" + model + R"(, "data": {"kind": "tokens", "batch_size": 2, )" + data + "}}"),
                           "cfg.json", {});
}

job::Dataset load(const std::string& model, const std::string& data) {
  const job::Config c = config(model, data);
  return job::load_dataset(c, job::build_model(c));
}

std::string error_of(const std::string& model, const std::string& data) {
  try {
    load(model, data);
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

std::vector<int64_t> row(const at::Tensor& t) {
  const at::Tensor l = t.to(torch::kLong).contiguous();
  return std::vector<int64_t>(l.data_ptr<int64_t>(), l.data_ptr<int64_t>() + l.numel());
}

std::vector<int64_t> ids_from(const std::vector<int64_t>& all, int64_t begin, int64_t n) {
  return std::vector<int64_t>(all.begin() + begin, all.begin() + begin + n);
}

}  // namespace

TEST(TokensData, WindowsAndTargetsAreTheFilesIdsExactly) {
  // uint16 ids above 32767: held as int16, they must come back unsigned.
  std::vector<uint16_t> ids;
  std::vector<int64_t> wide;
  for (int i = 0; i < 100; ++i) {
    ids.push_back(static_cast<uint16_t>((i * 7919) % 65536));
    wide.push_back(ids.back());
  }
  const std::string bin = write_bin("ids.bin", ids);
  const int64_t T = 8;
  // 100 ids, test_fraction 0.2: 80 for training (windows every 4: (80 - 9) / 4 + 1 = 18), 20 for testing (every 8: 2).
  const job::Dataset d = load(gpt(65536, T), R"("path": ")" + bin + R"(", "stride": 4, "test_fraction": 0.2)");
  ASSERT_EQ(d.train.size(), 18);
  ASSERT_EQ(d.test.size(), 2);
  EXPECT_EQ(d.classes, 65536);
  for (int64_t b = 0; b < 9; ++b) {
    const job::Batch batch = d.train_batch(b, 2, 5);
    ASSERT_EQ(batch.input.scalar_type(), torch::kLong);
    ASSERT_EQ(batch.target.scalar_type(), torch::kLong);
    for (int64_t r = 0; r < 2; ++r) {
      const auto in = row(batch.input[r]), target = row(batch.target[r]);
      // Find the window by its first id: it starts at a multiple of the stride.
      int64_t start = -1;
      for (int64_t s = 0; s + T + 1 <= 80; s += 4)
        if (ids_from(wide, s, T) == in) start = s;
      ASSERT_GE(start, 0) << "batch " << b << " row " << r << " is no training window";
      EXPECT_EQ(target, ids_from(wide, start + 1, T));
    }
  }
  const job::Batch test = d.test_batch(0, 2);
  EXPECT_EQ(row(test.input[0]), ids_from(wide, 80, T));
  EXPECT_EQ(row(test.target[1]), ids_from(wide, 89, T));
  EXPECT_EQ(d.baseline_name, "unigram");
  EXPECT_GT(d.baseline_loss, 0);
}

TEST(TokensData, DrawnInTheSameOrderFromTheSameSeed) {
  std::vector<uint16_t> ids;
  for (int i = 0; i < 400; ++i) ids.push_back(static_cast<uint16_t>(i * 37 % 397));
  const std::string bin = write_bin("seed.bin", ids);
  const std::string data = R"("path": ")" + bin + R"(")";
  // A data set keeps its epoch's order: one per seed.
  const job::Dataset a = load(gpt(400, 4), data), b = load(gpt(400, 4), data), other = load(gpt(400, 4), data);
  bool differs = false;
  for (int64_t step = 0; step < 120; ++step) {  // past the first epoch (90 windows, 45 batches)
    const job::Batch x = a.train_batch(step, 2, 1), y = b.train_batch(step, 2, 1);
    EXPECT_TRUE(torch::equal(x.input, y.input) && torch::equal(x.target, y.target)) << step;
    differs |= !torch::equal(x.input, other.train_batch(step, 2, 2).input);
  }
  EXPECT_TRUE(differs) << "another seed draws another order";
}

TEST(TokensData, Uint32BinAndNpyFilesAndATestFile) {
  std::vector<uint32_t> ids;
  std::vector<int64_t> wide;
  for (uint32_t i = 0; i < 60; ++i) {
    ids.push_back(70000 - i);  // above uint16's range
    wide.push_back(ids.back());
  }
  const std::string bin = write_bin("ids32.bin", ids);
  const job::Dataset d = load(gpt(70001, 5), R"("path": ")" + bin + R"(", "dtype": "uint32")");
  EXPECT_EQ(row(d.test_batch(0, 1).input[0]), ids_from(wide, 54, 5));
  // Raw files of the other types data.dtype names: the same 60 positions, the same test window.
  std::vector<uint8_t> bytes;
  std::vector<int64_t> longs, wide8;
  for (int64_t i = 0; i < 60; ++i) {
    bytes.push_back(static_cast<uint8_t>(255 - i));
    wide8.push_back(255 - i);
    longs.push_back(5000000000LL % 90000 + i);
  }
  const job::Dataset d8 = load(gpt(256, 5), R"("path": ")" + write_bin("ids8.bin", bytes) + R"(", "dtype": "uint8")");
  EXPECT_EQ(row(d8.test_batch(0, 1).input[0]), ids_from(wide8, 54, 5));
  const job::Dataset d64 = load(gpt(90000, 5), R"("path": ")" + write_bin("ids64.bin", longs) + R"(", "dtype": "int64")");
  EXPECT_EQ(row(d64.test_batch(0, 1).input[0]), ids_from(longs, 54, 5));
  // .npy files by numpy, their dtype from the header; the test split from a second file.
  python(R"(
import numpy
numpy.save(")" + dir() + R"(/u16.npy", (numpy.arange(300) * 211 % 60000).astype(numpy.uint16))
numpy.save(")" + dir() + R"(/i64.npy", (numpy.arange(40) * 13 % 60000).astype(numpy.int64))
numpy.save(")" + dir() + R"(/u32.npy", (numpy.arange(400) + 4000000000).astype(numpy.uint32))
numpy.save(")" + dir() + R"(/f32.npy", numpy.zeros(40, dtype=numpy.float32))
numpy.save(")" + dir() + R"(/two_d.npy", numpy.zeros((4, 10), dtype=numpy.uint16))
)");
  const job::Dataset n = load(gpt(60000, 6), R"("path": ")" + dir() + R"(/u16.npy", "test_path": ")" + dir() + R"(/i64.npy")");
  EXPECT_EQ(n.train.size(), (300 - 7) / 6 + 1);
  EXPECT_EQ(n.test.size(), (40 - 7) / 6 + 1);
  std::vector<int64_t> u16, i64;
  for (int64_t i = 0; i < 300; ++i) u16.push_back(i * 211 % 60000);
  for (int64_t i = 0; i < 40; ++i) i64.push_back(i * 13 % 60000);
  EXPECT_EQ(row(n.test_batch(0, 2).target[1]), ids_from(i64, 7, 6));
  const at::Tensor first = n.train.inputs[5];
  EXPECT_EQ(row(first.to(torch::kLong).bitwise_and(0xFFFF)), ids_from(u16, 30, 6));
  const job::Batch b = n.train_batch(0, 2, 0);
  for (int64_t r = 0; r < 2; ++r) {
    const auto in = row(b.input[r]);
    bool found = false;
    for (int64_t s = 0; s + 7 <= 300; s += 6) found |= ids_from(u16, s, 6) == in;
    EXPECT_TRUE(found) << "row " << r << " is no training window";
  }
  // Every id of uint32 4e9 is beyond any vocabulary: named with its byte offset (the .npy header first).
  const std::string e = error_of(gpt(60000, 6), R"("path": ")" + dir() + R"(/u32.npy")");
  EXPECT_NE(e.find(dir() + "/u32.npy: token id 4000000000 at byte offset 128 (id number 0) is not below model.vocab_size 60000"),
            std::string::npos)
      << e;
  EXPECT_NE(error_of(gpt(60000, 6), R"("path": ")" + dir() + R"(/f32.npy")").find("holds dtype '<f4'; token ids are read as"),
            std::string::npos);
  EXPECT_NE(error_of(gpt(60000, 6), R"("path": ")" + dir() + R"(/two_d.npy")").find("an array of 2 dimensions"), std::string::npos);
  EXPECT_NE(error_of(gpt(60000, 6), R"("path": ")" + dir() + R"(/u16.npy", "dtype": "uint32")")
                .find("holds uint16 ids (its header), but data.dtype says uint32"),
            std::string::npos);
}

TEST(TokensData, BadFilesAndConfigsAreOneLineErrors) {
  std::vector<uint16_t> ids(50, 3);
  ids[37] = 900;
  const std::string bin = write_bin("bad.bin", ids);
  EXPECT_EQ(error_of(gpt(100, 4), R"("path": ")" + bin + R"(")"),
            bin + ": token id 900 at byte offset 74 (id number 37) is not below model.vocab_size 100");
  // In the test split too (the last tenth: ids 45..49).
  ids[37] = 3;
  ids[47] = 100;
  write_bin("bad.bin", ids);
  EXPECT_EQ(error_of(gpt(100, 4), R"("path": ")" + bin + R"(")"),
            bin + ": token id 100 at byte offset 94 (id number 47) is not below model.vocab_size 100");
  ids[47] = 3;
  write_bin("bad.bin", ids);
  const std::string odd = write_bin("odd.bin", std::vector<uint8_t>(51, 1));
  EXPECT_NE(error_of(gpt(100, 4), R"("path": ")" + odd + R"(")").find("51 bytes are not a whole number of uint16 ids (2 bytes each"),
            std::string::npos);
  const std::string shorter = write_bin("short.bin", std::vector<uint16_t>(20, 1));
  EXPECT_NE(error_of(gpt(100, 4), R"("path": ")" + shorter + R"(")").find("too short: its 20 ids give 18 for training and 2 for testing"),
            std::string::npos);
  // The same short file is a whole test split.
  EXPECT_EQ(error_of(gpt(100, 4), R"("path": ")" + bin + R"(", "test_path": ")" + shorter + R"(", "stride": 1)"), "(loaded)");
  EXPECT_NE(error_of(gpt(100, 4), R"("path": ")" + dir() + R"(/absent.bin")").find("absent.bin: cannot open (No such file"),
            std::string::npos);
  // A FIFO is refused before anything opens it (opening would wait for a writer).
  const std::string fifo = dir() + "/fifo.bin";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(error_of(gpt(100, 4), R"("path": ")" + fifo + R"(")"), fifo + ": not a regular file");
  // An .npy file cut short of what its header describes.
  std::vector<uint16_t> header_and_ids(64 + 50, 1);
  const std::string cut = write_bin("cut.npy", header_and_ids);
  {
    std::string h = "\x93NUMPY";
    h += std::string("\x01\x00", 2);
    std::string dict = "{'descr': '<u2', 'fortran_order': False, 'shape': (400,), }";
    dict.append(128 - 10 - dict.size() - 1, ' ');
    dict += '\n';
    const uint16_t len = static_cast<uint16_t>(dict.size());
    h.append(reinterpret_cast<const char*>(&len), 2);
    h += dict;
    std::fstream f(cut, std::ios::binary | std::ios::in | std::ios::out);
    f.write(h.data(), static_cast<std::streamsize>(h.size()));
  }
  EXPECT_EQ(error_of(gpt(100, 4), R"("path": ")" + cut + R"(")"), cut + ": truncated: 228 bytes, its header describes 928");
  // Dimensions whose product wraps past 2^64 to 2 (found by fuzz/token_file_fuzz.cpp): refused, not multiplied.
  {
    std::string dict = "{'descr': '<u2', 'fortran_order': False, 'shape': (239075442, 77158673929), }";
    dict.append(128 - 10 - dict.size() - 1, ' ');
    dict += '\n';
    std::string h = std::string("\x93NUMPY\x01\x00", 8);
    const uint16_t len = static_cast<uint16_t>(dict.size());
    h.append(reinterpret_cast<const char*>(&len), 2);
    std::ofstream(dir() + "/huge.npy", std::ios::binary) << h << dict;
  }
  EXPECT_EQ(error_of(gpt(100, 4), R"("path": ")" + dir() + R"(/huge.npy")"), dir() + "/huge.npy: a shape of more than 2^50 values");
  // Config: keys checked where they are read.
  EXPECT_NE(error_of(gpt(100, 4), R"("path": ")" + bin + R"(", "dtype": "int8")").find("cfg.json: data.dtype: unknown value \"int8\""),
            std::string::npos);
  EXPECT_NE(error_of(gpt(100, 4), R"("path": ")" + bin + R"(", "test_path": ")" + bin + R"(", "test_fraction": 0.2)")
                .find("cfg.json: data.test_fraction: is not used with data.test_path"),
            std::string::npos);
  EXPECT_NE(error_of(gpt(100, 4), R"("path": "")").find("cfg.json: data.path: is required for data.kind tokens"), std::string::npos);
  try {
    job::parse_config(nlohmann::json::parse(R"({"model": {"family": "mlp"}, "data": {"kind": "text", "path": "x", "test_path": "y"}})"),
                      "cfg.json", {});
    ADD_FAILURE() << "test_path accepted for data.kind text";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.json: data.test_path: is read by data.kind tokens only"), std::string::npos) << e.what();
  }
  EXPECT_NE(error_of(R"({"family": "mlp", "in": 4, "width": 8, "layers": 1, "out": 3})", R"("path": ")" + bin + R"(")")
                .find("cfg.json: data.kind: data.kind tokens needs a model that takes a sequence of token ids"),
            std::string::npos);
}

TEST(TokensData, AGptModelTrainsOnATokensFileThroughTheCommandLine) {
  // A learnable stream: each id follows from the one before, with a little noise.
  std::vector<uint16_t> ids;
  uint32_t x = 1;
  for (int i = 0; i < 6000; ++i) {
    x = x * 1103515245u + 12345u;
    ids.push_back(static_cast<uint16_t>(i == 0 || (x >> 16) % 10 == 0 ? (x >> 8) % 300 : (ids.back() * 7 + 3) % 300));
  }
  const std::string bin = write_bin("train.bin", ids);
  const std::string cfg = write_config("tokens.json", R"({
  "model": {"family": "gpt", "vocab_size": 300, "seq_len": 16, "d_model": 32, "n_heads": 2, "n_layers": 2, "dropout": 0.0},
  "data": {"kind": "tokens", "path": ")" + bin + R"(", "batch_size": 8, "stride": 8},
  "pipeline": {"stages": 2, "micro_batches": 2},
  "optimizer": {"kind": "adamw", "lr": 0.01},
  "train": {"steps": 40, "seed": 3, "eval_batches": 4}
})");
  const auto r = run("train " + cfg);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("; unigram baseline "), std::string::npos) << r.out;
  // Trained: the test loss is below a uniform guess's ln 300 = 5.70.
  const auto at = r.out.find("test loss ");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_LT(std::stod(r.out.substr(at + 10)), std::log(300.0)) << r.out;
  // A bad id is the binary's one-line error too.
  ids[4321] = 300;
  write_bin("train.bin", ids);
  expect_clean_error(run("train " + cfg), "train.bin: token id 300 at byte offset 8642 (id number 4321) is not below model.vocab_size 300", 1);
}
