// safetensors (models/safetensors.h): every dtype written and read back bit for bit, views and
// copies, sharded checkpoints and their index; every malformed file or index refused in one line
// naming the file and the tensor; and files exchanged with Python's own safetensors package
// (skipped, with the reason, where the project's Python lacks it).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <torch/torch.h>

#include "models/safetensors.h"
#include "tests/cli_helpers.h"

using namespace pipetrain;
using models::SafetensorsCheckpoint;
using models::SafetensorsError;
using models::SafetensorsFile;

namespace {

std::string dir() {
  static const std::string d = [] {
    const std::string p = ::testing::TempDir() + "/pipetrain_safetensors_" + std::to_string(::getpid());
    std::filesystem::remove_all(p);  // an earlier process of the same id may have left its files (a FIFO)
    std::filesystem::create_directories(p);
    return p;
  }();
  return d;
}

std::string bytes_of(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel()) * c.element_size());
}

// One tensor of every dtype, with values that a careless conversion would change (NaN, -0, inf,
// the top bit of unsigned types), a scalar and an empty tensor.
models::NamedTensors every_dtype() {
  const auto f = torch::tensor({1.5, -0.0, std::numeric_limits<double>::infinity(), std::nan(""), 3e-8, -7.25}, torch::kDouble).reshape({2, 3});
  models::NamedTensors t{{"f64", f},
                         {"f32", f.to(torch::kFloat).t()},  // not contiguous
                         {"f16", f.to(torch::kHalf)},
                         {"bf16", f.to(torch::kBFloat16)},
                         {"i64", torch::tensor({-(int64_t{1} << 62), int64_t{5}, int64_t{-3}})},
                         {"i32", torch::arange(-6, 6, torch::kInt).reshape({3, 2, 2})},
                         {"i16", torch::tensor({-32768, 32767, 1}, torch::kShort)},
                         {"i8", torch::tensor({-128, 127, 0}, torch::kChar)},
                         {"u8", torch::tensor({0, 255, 17}, torch::kByte)},
                         {"bool", torch::tensor({true, false, true})},
                         {"u16", torch::tensor({65535, 1}, torch::kInt).to(torch::kUInt16)},
                         {"scalar", torch::tensor(2.5f)},
                         {"empty", torch::zeros({0, 4})},
                         {"f8_e4m3", f.to(torch::kFloat).to(torch::kFloat8_e4m3fn)},
                         {"c64", torch::complex(f.to(torch::kFloat), -f.to(torch::kFloat))}};
  return t;
}

// A file of `header` (JSON text) and `data`, with the length given or computed.
std::string file_with(const std::string& name, const std::string& header, const std::string& data = "",
                      int64_t length = -1) {
  const std::string path = dir() + "/" + name + ".safetensors";
  const uint64_t n = length < 0 ? header.size() : static_cast<uint64_t>(length);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
  return path;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string open_error(const std::string& path) {
  return error_of([&] { SafetensorsFile file(path); });
}

bool python_has_safetensors() {
  return test::shell(std::string(PIPETRAIN_PYTHON) + " -c 'import safetensors' >/dev/null 2>&1").status == 0;
}

void python(const std::string& code) {
  const std::string script = dir() + "/run.py";
  std::ofstream(script) << code;
  const auto r = test::shell(std::string(PIPETRAIN_PYTHON) + " " + script + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
}

}  // namespace

TEST(Safetensors, EveryDtypeRoundTripsBitForBitAsViews) {
  const auto tensors = every_dtype();
  const std::string path = dir() + "/all.safetensors";
  models::save_safetensors(path, tensors, {{"format", "pt"}});
  const SafetensorsFile file(path);
  EXPECT_EQ(file.header().metadata.at("format"), "pt");
  EXPECT_EQ(file.names().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const at::Tensor back = file.get(name);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(back.sizes(), t.sizes()) << name;
    EXPECT_EQ(bytes_of(back), bytes_of(t)) << name;
    // Our writer aligns every tensor: each non-empty one is a view of the mapping.
    EXPECT_EQ(file.is_view(name), t.numel() > 0) << name;
  }
  // Largest item first: the 8-byte types lead.
  EXPECT_EQ(file.header().entries.front().dtype, "F64");
  // Writing into a view changes this process's copy of the page, never the file.
  file.get("f64").fill_(0);
  EXPECT_EQ(bytes_of(SafetensorsFile(path).get("f64")), bytes_of(tensors[0].second));
  EXPECT_EQ(SafetensorsFile(path).header().data_start % 8, 0u);
}

TEST(Safetensors, TensorsOutliveTheirFile) {
  const std::string path = dir() + "/outlive.safetensors";
  models::save_safetensors(path, {{"w", torch::arange(1000, torch::kFloat)}});
  at::Tensor w;
  {
    const SafetensorsFile file(path);
    w = file.get("w");
    ASSERT_TRUE(file.is_view("w"));
  }
  EXPECT_EQ(w[999].item<float>(), 999.0f);  // the mapping lives while the tensor does
}

TEST(Safetensors, UnalignedDataIsCopied) {
  // A header of 3 bytes' padding less than our writer's: the F32 tensor starts at an odd address.
  const std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_NE((8 + header.size()) % 4, 0u);
  const float values[2] = {1.25f, -3.5f};
  const std::string path = file_with("unaligned", header, std::string(reinterpret_cast<const char*>(values), 8));
  const SafetensorsFile file(path);
  EXPECT_FALSE(file.is_view("w"));
  const at::Tensor w = file.get("w");
  EXPECT_EQ(w[0].item<float>(), 1.25f);
  EXPECT_EQ(w[1].item<float>(), -3.5f);
}

TEST(Safetensors, MalformedFilesAreOneLineErrorsNamingFileAndTensor) {
  const std::string ok = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string eight(8, '\0');
  struct Case {
    std::string name, header, data, needle;
    int64_t length = -1;
  };
  const std::vector<Case> cases{
      {"too_long_header", "{" + ok + "}", eight, "a header of 1000 bytes in a file of", 1000},
      {"huge_header", "{" + ok + "}", eight, "a header of 200000000 bytes (at most 100000000", 200000000},
      {"not_object", "[1, 2]", "", "not a JSON object"},
      {"bad_json", "{\"w\": {", "", "invalid JSON"},
      {"not_utf8", "{\"w\xff\": 1}", "", "invalid JSON"},
      {"twice", "{" + ok + "," + ok + "}", eight, "the key 'w' appears twice"},
      {"dtype", R"({"w":{"dtype":"F4","shape":[16],"data_offsets":[0,8]}})", eight, "tensor 'w': dtype 'F4' is not one read here"},
      {"no_dtype", R"({"w":{"shape":[2],"data_offsets":[0,8]}})", eight, "tensor 'w': no dtype"},
      {"negative_dim", R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight, "tensor 'w': shape [-2] has a dimension"},
      {"float_dim", R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", eight, "has a dimension that is not a size"},
      {"huge_shape", R"({"w":{"dtype":"F32","shape":[2305843009213693952,2],"data_offsets":[0,8]}})", eight, "is more than 2^62 bytes"},
      {"empty_huge", R"({"w":{"dtype":"F32","shape":[0,2305843009213693952,2305843009213693952],"data_offsets":[0,0]}})", "",
       "tensor 'w': shape [0,2305843009213693952,2305843009213693952] multiplies past 2^62 (its strides)"},
      {"size", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight, "tensor 'w': data_offsets [0,8] span 8 bytes, but F32 of shape [3] is 12 bytes"},
      {"backwards", R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", eight, "end before they begin"},
      {"past_end", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", eight, "tensor 'w': data_offsets end at 16, past the 8 bytes"},
      {"overlap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight,
       "tensor 'b': data_offsets [4, 8) overlap tensor 'a' [0, 8)"},
      {"gap", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight, "tensor 'a': data_offsets begin at 4, leaving bytes [0, 4)"},
      {"trailing", "{" + ok + "}", eight + "xx", "2 bytes after the last tensor's data"},
      {"bool", R"({"b":{"dtype":"BOOL","shape":[8],"data_offsets":[0,8]}})", std::string("\1\0\2\0\0\0\0\0", 8), "tensor 'b': BOOL byte 2 is 2"},
      {"metadata", R"({"__metadata__":{"n":1}})", "", "__metadata__ 'n' is number 1, not a string"},
      {"unknown_key", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", eight, "tensor 'w': unknown key 'x'"},
      {"deep", "{\"w\":" + std::string(20, '[') + std::string(20, ']') + "}", "", "nested deeper than 8"},
      {"entry_type", R"({"w":3})", "", "tensor 'w': its header entry is number 3"},
  };
  for (const auto& c : cases) {
    const std::string path = file_with(c.name, c.header, c.data, c.length);
    const std::string e = open_error(path);
    EXPECT_NE(e.find(path + ": "), std::string::npos) << c.name << ": " << e;
    EXPECT_NE(e.find(c.needle), std::string::npos) << c.name << ": " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << c.name << ": " << e;
    for (unsigned char ch : e) EXPECT_TRUE(ch >= 0x20 && ch < 0x7f) << c.name << ": byte " << int(ch);
  }
  // Shorter than the length field itself, and not a file at all.
  std::ofstream(dir() + "/short.safetensors") << "abc";
  EXPECT_NE(open_error(dir() + "/short.safetensors").find("too short for a safetensors file (3 bytes"), std::string::npos);
  EXPECT_NE(open_error(dir()).find("not a regular file"), std::string::npos);
  // A FIFO is refused at once, not read (which would wait for a writer).
  const std::string fifo = dir() + "/fifo.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(open_error(fifo).find(fifo + ": not a regular file"), std::string::npos);
  EXPECT_NE(open_error(dir() + "/absent.safetensors").find("cannot open (No such file"), std::string::npos);
  // A name that is not in the file.
  const SafetensorsFile file(file_with("ok", "{" + ok + "}", eight));
  EXPECT_NE(error_of([&] { file.get("v"); }).find("tensor 'v': not in the file"), std::string::npos);
}

TEST(Safetensors, WriterRefusesWhatTheFormatCannotHold) {
  const std::string path = dir() + "/refused.safetensors";
  const auto w = torch::ones({2});
  EXPECT_NE(error_of([&] { models::save_safetensors(path, {{"w", w}, {"w", w}}); }).find("tensor 'w': given twice"), std::string::npos);
  EXPECT_NE(error_of([&] { models::save_safetensors(path, {{"__metadata__", w}}); }).find("a reserved name"), std::string::npos);
  EXPECT_NE(error_of([&] { models::save_safetensors(path, {{"c", torch::ones({2}, torch::kComplexDouble)}}); })
                .find("tensor 'c': dtype ComplexDouble has no safetensors name"),
            std::string::npos);
  EXPECT_NE(error_of([&] { models::save_safetensors(path, {{"n\xff", w}}); }).find("not UTF-8"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Safetensors, ShardedCheckpointsRoundTripAndTheirIndexIsChecked) {
  models::NamedTensors tensors;
  for (int i = 0; i < 5; ++i) tensors.emplace_back("layer." + std::to_string(i), torch::full({10}, float(i)));  // 40 bytes each
  const std::string d = dir() + "/sharded";
  // 100 bytes a shard: two tensors each, then one.
  const auto files = models::save_safetensors_checkpoint(d, tensors, 100);
  ASSERT_EQ(files, (std::vector<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                             "model-00003-of-00003.safetensors", "model.safetensors.index.json"}));
  SafetensorsCheckpoint ckpt(d);
  ASSERT_EQ(ckpt.names().size(), 5u);
  for (const auto& [name, t] : tensors) EXPECT_TRUE(torch::equal(ckpt.get(name), t)) << name;
  EXPECT_EQ(ckpt.file_of("layer.4"), d + "/model-00003-of-00003.safetensors");
  // Written whole when they fit: model.safetensors, and the index of the earlier save is gone.
  EXPECT_EQ(models::save_safetensors_checkpoint(d, tensors, 1000), std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(std::filesystem::exists(d + "/model.safetensors.index.json"));
  EXPECT_EQ(SafetensorsCheckpoint(d).files().size(), 1u);
  EXPECT_TRUE(torch::equal(SafetensorsCheckpoint(d + "/model.safetensors").get("layer.2"), tensors[2].second));

  // Broken indexes, each one line naming the index (or the shard) and the tensor.
  models::save_safetensors_checkpoint(d, tensors, 100);
  const std::string index = d + "/model.safetensors.index.json";
  const std::string good = [&] {
    std::ifstream in(index);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }();
  auto with_index = [&](const std::string& text) {
    std::ofstream(index) << text;
    return error_of([&] { SafetensorsCheckpoint c(d); });
  };
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  const std::string shard1 = "model-00001-of-00003.safetensors", shard3 = "model-00003-of-00003.safetensors";
  EXPECT_NE(with_index(replaced("\"layer.4\": \"" + shard3, "\"layer.4\": \"" + shard1))
                .find("weight_map puts tensor 'layer.4' in '" + shard1 + "', which does not hold it"),
            std::string::npos);
  EXPECT_NE(with_index(replaced("\"layer.4\": \"" + shard3, "\"layer.4\": \"absent.safetensors"))
                .find("weight_map names 'absent.safetensors' (for tensor 'layer.4'), which is not in"),
            std::string::npos);
  EXPECT_NE(with_index(replaced("\"layer.4\": \"" + shard3, "\"layer.4\": \"../x")).find("names '../x', not a file in the index's folder"),
            std::string::npos);
  // A tensor in a file the map gives for another tensor, but not named by the map itself.
  EXPECT_NE(with_index(replaced("\"layer.1\": \"" + shard1 + "\",", "")).find(shard1 + ": tensor 'layer.1' is not in the weight_map of"),
            std::string::npos);
  EXPECT_NE(with_index(replaced("\"layer.1\": \"" + shard1 + "\",", "\"layer.1\": \"" + shard1 + "\", \"layer.1\": \"" + shard1 + "\","))
                .find("the key 'layer.1' appears twice"),
            std::string::npos);
  EXPECT_NE(with_index(R"({"metadata": {}})").find("no weight_map"), std::string::npos);
  EXPECT_NE(with_index("{").find("invalid JSON"), std::string::npos);
  // The same name in two shards: the map names one, the other shard holds it too.
  std::ofstream(index) << good;
  models::save_safetensors(d + "/" + shard3, {{"layer.4", tensors[4].second}, {"layer.0", tensors[0].second}});
  EXPECT_NE(error_of([&] { SafetensorsCheckpoint c(d); }).find("tensor 'layer.0' is mapped to '" + shard1 + "'"), std::string::npos);
  EXPECT_NE(error_of([&] { SafetensorsCheckpoint c(dir() + "/nothing_here_" + std::to_string(::getpid())); }).find("cannot open"),
            std::string::npos);
  std::filesystem::create_directories(dir() + "/empty");
  EXPECT_NE(error_of([&] { SafetensorsCheckpoint c(dir() + "/empty"); }).find("neither model.safetensors.index.json nor model.safetensors"),
            std::string::npos);
}

// The dtypes both sides name, and the Python that checks them against the raw bytes.
const char* kPythonDtypes = R"(
import json, os, sys, torch
d = sys.argv[1] if len(sys.argv) > 1 else None
f = torch.tensor([1.5, -0.0, float("inf"), float("nan"), 3e-8, -7.25], dtype=torch.float64).reshape(2, 3)
tensors = {"f64": f, "f32": f.float().t().contiguous(), "f16": f.half(), "bf16": f.bfloat16(),
           "i64": torch.tensor([-(1 << 62), 5, -3]), "i32": torch.arange(-6, 6, dtype=torch.int32).reshape(3, 2, 2),
           "i16": torch.tensor([-32768, 32767, 1], dtype=torch.int16), "i8": torch.tensor([-128, 127, 0], dtype=torch.int8),
           "u8": torch.tensor([0, 255, 17], dtype=torch.uint8), "bool": torch.tensor([True, False, True]),
           "u16": torch.tensor([65535, 1], dtype=torch.int32).to(torch.uint16),
           "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4), "f8_e4m3": f.float().to(torch.float8_e4m3fn),
           "c64": torch.complex(f.float(), -f.float())}
def raw(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
)";

TEST(Safetensors, FilesWrittenByPythonAreReadBitForBit) {
  if (!python_has_safetensors()) GTEST_SKIP() << "the project's Python has no safetensors package (scripts/setup.sh installs it)";
  python(std::string(kPythonDtypes) + R"(
from safetensors.torch import save_file
save_file(tensors, ")" + dir() + R"(/py.safetensors", metadata={"format": "pt", "by": "python"})
for k, t in tensors.items():
    open(")" + dir() + R"(/py." + k + ".raw", "wb").write(raw(t))
)");
  const SafetensorsFile file(dir() + "/py.safetensors");
  EXPECT_EQ(file.header().metadata.at("by"), "python");
  const auto expected = every_dtype();
  ASSERT_EQ(file.names().size(), expected.size());
  for (const auto& [name, t] : expected) {
    std::ifstream in(dir() + "/py." + name + ".raw", std::ios::binary);
    const std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const at::Tensor back = file.get(name);
    EXPECT_EQ(bytes_of(back), raw) << name;
    EXPECT_EQ(bytes_of(back), bytes_of(t)) << name << ": the same values as made here";
    EXPECT_EQ(back.sizes(), t.sizes()) << name;
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(file.is_view(name), t.numel() > 0) << name << ": Python's writer aligns too";
  }
}

TEST(Safetensors, FilesWrittenHereAreLoadedByPythonBitForBit) {
  if (!python_has_safetensors()) GTEST_SKIP() << "the project's Python has no safetensors package (scripts/setup.sh installs it)";
  models::save_safetensors(dir() + "/ours.safetensors", every_dtype(), {{"format", "pt"}});
  // Sharded as well: Python reads the index and each shard.
  models::NamedTensors big;
  for (int i = 0; i < 4; ++i) big.emplace_back("h." + std::to_string(i) + ".weight", torch::arange(64, torch::kFloat).reshape({8, 8}) * i);
  models::save_safetensors_checkpoint(dir() + "/ours_sharded", big, 600);
  python(std::string(kPythonDtypes) + R"(
from safetensors.torch import load_file
from safetensors import safe_open
back = load_file(")" + dir() + R"(/ours.safetensors")
assert sorted(back) == sorted(tensors), sorted(back)
for k, t in tensors.items():
    assert back[k].dtype == t.dtype and back[k].shape == t.shape, (k, back[k].dtype, back[k].shape)
    assert raw(back[k]) == raw(t), k
with safe_open(")" + dir() + R"(/ours.safetensors", "pt") as f:
    assert f.metadata() == {"format": "pt"}, f.metadata()
index = json.load(open(")" + dir() + R"(/ours_sharded/model.safetensors.index.json"))
assert index["metadata"]["total_size"] == 4 * 256, index
seen = {}
for name, shard in index["weight_map"].items():
    seen[name] = load_file(")" + dir() + R"(/ours_sharded/" + shard)[name]
assert len(set(index["weight_map"].values())) == 2
for i in range(4):
    assert torch.equal(seen[f"h.{i}.weight"], torch.arange(64, dtype=torch.float32).reshape(8, 8) * i), i
print("python: ok")
)");
}
