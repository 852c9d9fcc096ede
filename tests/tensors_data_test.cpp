// data.kind "tensors": inputs and targets written by Python (the project's venv) with torch.save
// and numpy.save, read as written (values, shapes, splits by key and by fraction), trained on, and
// every bad file refused in one line naming the file and the key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <torch/torch.h>

#include "common/error.h"
#include "job/config.h"
#include "job/data.h"
#include "job/job.h"
#include "tests/cli_helpers.h"

using namespace pipetrain;

namespace {

std::string dir() {
  static const std::string d = [] {
    const std::string p = ::testing::TempDir() + "/pipetrain_tensors_" + std::to_string(::getpid());
    std::filesystem::remove_all(p);  // an earlier process of the same id may have left its files (a FIFO)
    std::filesystem::create_directories(p + "/npy");
    return p;
  }();
  return d;
}

void python(const std::string& code) {
  const std::string script = dir() + "/make.py";
  std::ofstream(script) << code;
  const auto r = test::shell(std::string(PIPETRAIN_PYTHON) + " " + script + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
}

job::Config config_for(const std::string& model, const std::string& path) {
  return job::parse_config(nlohmann::json::parse(R"({"model": )" + model +
                                                 R"(, "data": {"kind": "tensors", "batch_size": 4, "path": ")" + path +
                                                 R"("}})"),
                           "cfg.json", {});
}

job::Dataset load(const std::string& model, const std::string& path) {
  const job::Config c = config_for(model, path);
  return job::load_dataset(c, job::build_model(c));
}

std::string error_of(const std::string& model, const std::string& path) {
  try {
    load(model, path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

const std::string kMlp = R"({"family": "mlp", "in": 6, "width": 8, "layers": 1, "out": 3})";

TEST(TensorsData, WrittenByPythonReadAsWritten) {
  python(R"(
import numpy, torch
x = torch.arange(40 * 6, dtype=torch.float32).reshape(40, 6).sin()
y = torch.arange(40) % 3
torch.save({"inputs": x, "targets": y, "test_inputs": x[:10] * 2, "test_targets": y[:10]}, ")" + dir() + R"(/data.pt")
numpy.save(")" + dir() + R"(/npy/inputs.npy", (numpy.arange(50 * 6) % 251).astype(numpy.uint8).reshape(50, 6))
numpy.save(")" + dir() + R"(/npy/targets.npy", (numpy.arange(50) % 3).astype(numpy.int32))
)");
  const job::Dataset pt = load(kMlp, dir() + "/data.pt");
  EXPECT_EQ(pt.train.size(), 40);
  EXPECT_EQ(pt.test.size(), 10);
  EXPECT_EQ(pt.classes, 3);
  const at::Tensor x = torch::arange(40 * 6, torch::kFloat).reshape({40, 6}).sin();
  EXPECT_TRUE(torch::equal(pt.train.inputs, x));
  EXPECT_TRUE(torch::equal(pt.test.inputs, x.narrow(0, 0, 10) * 2));
  // The folder of .npy files: memory-mapped, the last tenth (data.test_fraction) the test split.
  const job::Dataset npy = load(kMlp, dir() + "/npy");
  EXPECT_EQ(npy.train.size(), 45);
  EXPECT_EQ(npy.test.size(), 5);
  EXPECT_EQ(npy.train.inputs.scalar_type(), torch::kByte);
  EXPECT_EQ(npy.train.inputs[7][5].item<int>(), (7 * 6 + 5) % 251);
  const job::Batch b = npy.test_batch(0, 4);
  EXPECT_EQ(b.input.scalar_type(), torch::kFloat);  // widened per batch
  EXPECT_EQ(b.target.scalar_type(), torch::kLong);
  // And it trains through the binary.
  const std::string cfg = write_config("tensors.json", R"({"model": )" + kMlp +
                                                           R"(, "data": {"kind": "tensors", "batch_size": 8, "path": ")" +
                                                           dir() + R"(/npy"}, "pipeline": {"stages": 2, "micro_batches": 2}})");
  Result r = run("train " + cfg + " --steps 3 --quiet");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("test accuracy"), std::string::npos) << r.out;
}

TEST(TensorsData, BadFilesAreOneLineNamingTheFileAndKey) {
  const std::string d = dir();
  python(R"(
import numpy, torch
torch.save({"inputs": torch.zeros(4, 6), "targets": torch.zeros(4)}, ")" + d + R"(/float_targets.pt")
torch.save({"inputs": torch.zeros(4, 6), "targets": torch.zeros(5, dtype=torch.long)}, ")" + d + R"(/lengths.pt")
torch.save({"x": torch.zeros(4, 6)}, ")" + d + R"(/keys.pt")
torch.save(torch.zeros(3), ")" + d + R"(/one.pt")
numpy.save(")" + d + R"(/cut.npy", numpy.zeros((100, 6), dtype=numpy.float32))
numpy.save(")" + d + R"(/complex.npy", numpy.zeros((4, 6), dtype=numpy.complex64))
)");
  std::filesystem::resize_file(d + "/cut.npy", 1000);
  std::ofstream(d + "/junk.pt") << "not a tensor file";
  EXPECT_EQ(error_of(kMlp, d + "/float_targets.pt"), d + "/float_targets.pt: 'targets': Float, not class ids (integers)");
  EXPECT_EQ(error_of(kMlp, d + "/lengths.pt"), d + "/lengths.pt: 'inputs' holds 4 samples but " + d + "/lengths.pt: 'targets' 5");
  EXPECT_EQ(error_of(kMlp, d + "/keys.pt"), d + "/keys.pt: no 'inputs' tensor (keys: x)");
  EXPECT_NE(error_of(kMlp, d + "/one.pt").find(d + "/one.pt: holds a Tensor, not a dict of tensors"), std::string::npos);
  EXPECT_NE(error_of(kMlp, d + "/junk.pt").find(d + "/junk.pt: not a file saved by torch.save"), std::string::npos);
  for (const std::string f : {"cut", "complex"}) {
    std::filesystem::create_directories(d + "/" + f);
    std::filesystem::copy_file(d + "/" + f + ".npy", d + "/" + f + "/inputs.npy", std::filesystem::copy_options::overwrite_existing);
    std::filesystem::copy_file(d + "/" + f + ".npy", d + "/" + f + "/targets.npy", std::filesystem::copy_options::overwrite_existing);
  }
  EXPECT_EQ(error_of(kMlp, d + "/cut"), d + "/cut/inputs.npy: truncated: 1000 bytes, its header describes 2528");
  EXPECT_NE(error_of(kMlp, d + "/complex").find(d + "/complex/inputs.npy: holds dtype '<c8'"), std::string::npos);
  EXPECT_EQ(error_of(kMlp, d + "/npy_missing"), d + "/npy_missing: cannot open (No such file or directory)");
  ::mkfifo((d + "/fifo.pt").c_str(), 0644);
  EXPECT_EQ(error_of(kMlp, d + "/fifo.pt"), d + "/fifo.pt: not a regular file");
}

}  // namespace

// An .npy shape whose product wraps past 2^64 to 2 values (239075442 x 77158673929 = 2^64 + 2,
// found by fuzz/token_file_fuzz.cpp in the header reader both kinds share): refused before it is
// multiplied, not mapped as an array over 2 bytes.
TEST(TensorsData, NpyShapeOverflowIsRefused) {
  const std::string folder = dir() + "/overflow";
  std::filesystem::create_directories(folder);
  std::string dict = "{'descr': '|u1', 'fortran_order': False, 'shape': (239075442, 77158673929), }";
  dict.append(128 - 10 - dict.size() - 1, ' ');
  dict += '\n';
  const uint16_t len = static_cast<uint16_t>(dict.size());
  std::string header = std::string("\x93NUMPY\x01\x00", 8);
  header.append(reinterpret_cast<const char*>(&len), 2);
  std::ofstream(folder + "/inputs.npy", std::ios::binary) << header << dict << "ab";
  std::ofstream(folder + "/targets.npy", std::ios::binary) << header << dict << "ab";
  EXPECT_EQ(error_of(kMlp, folder), folder + "/inputs.npy: a shape of more than 2^50 values");
}

// A TorchScript model's input is the data's: model.input_shape may be left out (read from the
// torch.save file, or from the header of inputs.npy), and one that differs from the samples'
// shape is one line naming both. A shape the network cannot take names the data it came from.
TEST(TensorsData, ATorchScriptModelTakesItsInputShapeFromTheData) {
  python(R"(
import numpy, torch
net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(2 * 4 * 4, 3))
torch.jit.script(net).save(")" + dir() + R"(/net.pt")
torch.save({"inputs": torch.randn(12, 1, 4, 4), "targets": torch.arange(12) % 3}, ")" + dir() + R"(/images.pt")
torch.save({"inputs": torch.randn(12, 1, 5, 5), "targets": torch.arange(12) % 3}, ")" + dir() + R"(/larger.pt")
import os
os.makedirs(")" + dir() + R"(/images", exist_ok=True)
numpy.save(")" + dir() + R"(/images/inputs.npy", numpy.zeros((12, 1, 4, 4), numpy.float32))
numpy.save(")" + dir() + R"(/images/targets.npy", numpy.arange(12) % 3)
)");
  const std::string net = dir() + "/net.pt";
  const std::string taken = R"({"family": "torchscript", "path": ")" + net + R"("})";
  for (const std::string& data : {dir() + "/images.pt", dir() + "/images"}) {
    const models::Model m = job::build_model(config_for(taken, data));
    EXPECT_EQ(m.sample_shape, (std::vector<int64_t>{1, 4, 4})) << data;
    EXPECT_EQ(m.classes, 3);
    EXPECT_EQ(load(taken, data).train.inputs.sizes().slice(1).vec(), m.sample_shape);
  }
  const std::string same = R"({"family": "torchscript", "input_shape": [1, 4, 4], "path": ")" + net + R"("})";
  EXPECT_EQ(load(same, dir() + "/images.pt").classes, 3);
  const std::string flat = R"({"family": "torchscript", "input_shape": [16], "path": ")" + net + R"("})";
  EXPECT_EQ(error_of(flat, dir() + "/images.pt"),
            "cfg.json: model.input_shape: [16], but the samples of data.path " + dir() +
                "/images.pt have shape [1, 4, 4]; leave model.input_shape out to take the data's");
  const std::string larger = error_of(taken, dir() + "/larger.pt");
  EXPECT_EQ(larger.rfind("the samples of data.path " + dir() + "/larger.pt (shape [1, 5, 5]): model.input_shape: a sample "
                         "of this shape does not go through",
                         0),
            0u)
      << larger;
  EXPECT_EQ(larger.find('\n'), std::string::npos) << larger;
}
