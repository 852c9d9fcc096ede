// model.family "torchscript": an nn.Sequential scripted and saved by Python (the project's venv),
// split into stages by its children, equals the same network run in one process and Python's own
// loss; the export goes back into Python's model by load_state_dict; what cannot train correctly
// (scripted dropout, batch norm) is refused by name.
#include <gtest/gtest.h>

#include <fstream>

#include <torch/torch.h>

#include "common/error.h"
#include "models/model.h"
#include "pipeline/pipeline.h"
#include "tests/cli_helpers.h"
#include "tests/helpers.h"

using namespace pipetrain;
using nlohmann::json;

namespace {

std::string dir() {
  static const std::string d = [] {
    const std::string p = ::testing::TempDir() + "/pipetrain_torchscript_" + std::to_string(::getpid());
    std::filesystem::create_directories(p);
    return p;
  }();
  return d;
}

// Runs a Python script with the project's venv; its stdout.
std::string python(const std::string& name, const std::string& code) {
  const std::string script = dir() + "/" + name;
  std::ofstream(script) << code;
  const auto r = test::shell(std::string(PIPETRAIN_PYTHON) + " " + script + " 2>&1");
  EXPECT_EQ(r.status, 0) << r.out;
  return r.out;
}

models::Model load(const std::string& path, const std::vector<int64_t>& shape) {
  json cfg{{"family", "torchscript"}, {"path", path}, {"input_shape", shape}};
  JsonReader r(cfg, "model", "test.json");
  return models::build(r, 0);
}

// The batch both sides compute: a formula, the same in Python and here.
at::Tensor input() { return torch::arange(8 * 36, torch::kDouble).reshape({8, 1, 6, 6}).mul(0.37).sin(); }
at::Tensor target() { return torch::arange(8, torch::kLong).remainder(5); }

TEST(TorchScript, AScriptedSequentialTrainsAsOneProcessAndAsPython) {
  const std::string path = dir() + "/net.pt", exported = dir() + "/trained.pt";
  const std::string loss_text = python("make.py", R"(
import torch
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                          torch.nn.Linear(4 * 6 * 6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5)).double()
torch.jit.script(net).save(")" + path + R"(")
x = torch.arange(8 * 36, dtype=torch.double).reshape(8, 1, 6, 6).mul(0.37).sin()
y = torch.arange(8).remainder(5)
print(repr(torch.nn.functional.cross_entropy(net(x), y).item()))
)");
  const double python_loss = std::stod(loss_text);

  models::Model one = load(path, {1, 6, 6}), piped = load(path, {1, 6, 6});
  EXPECT_EQ(models::layer_names(one.layers), (std::vector<std::string>{"0", "1", "2", "3", "4", "5"}));
  EXPECT_EQ(one.classes, 5);
  auto loss = [](const at::Tensor& out, const at::Tensor& t) { return torch::nn::functional::cross_entropy(out, t); };
  at::Tensor h = input();
  for (auto& layer : *one.layers) h = layer.forward(h);
  const at::Tensor l = loss(h, target());
  l.backward();
  EXPECT_NEAR(l.item<double>(), python_loss, 1e-12);

  pipeline::PipelineOptions o;
  o.stages = 3;
  o.micro_batches = 4;
  o.recompute = Recompute::Always;  // each stage's forward also runs again in its backward
  pipeline::Pipeline pipe(piped.layers, o, loss);
  EXPECT_NEAR(pipe.forward_backward(input(), target()), l.item<double>(), 1e-12);
  for (const auto& p : one.layers->named_parameters()) {
    const at::Tensor g = piped.layers->named_parameters()[p.key()].grad();
    ASSERT_TRUE(g.defined()) << p.key();
    EXPECT_LT((g - p.value().grad()).abs().max().item<double>(), 1e-10) << p.key();
  }
  // Python's names, for Python's load_state_dict.
  const auto names = piped.layers->named_parameters().keys();
  EXPECT_EQ(names.front(), "0.weight");
  EXPECT_EQ(names.back(), "5.bias");
}

TEST(TorchScript, WhatCannotTrainCorrectlyIsRefusedByName) {
  const std::string drop = dir() + "/dropout.pt", bn = dir() + "/bn.pt", ok = dir() + "/ok.pt", junk = dir() + "/junk.pt";
  python("refused.py", R"(
import torch
torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1), torch.nn.Linear(4, 2))).save(")" +
                           drop + R"(")
torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))).save(")" +
                           bn + R"(")
torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))).save(")" + ok + R"(")
)");
  std::ofstream(junk) << "not a model";
  auto error = [](const std::string& path, std::vector<int64_t> shape) {
    try {
      load(path, shape);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  EXPECT_NE(error(drop, {4}).find("test.json: model.path: " + drop + ".1 is a Dropout: scripted dropout draws from libtorch's global generator"),
            std::string::npos)
      << error(drop, {4});
  EXPECT_NE(error(bn, {4}).find(".1 is a BatchNorm1d: scripted batch norm updates its running statistics per micro-batch"),
            std::string::npos)
      << error(bn, {4});
  EXPECT_NE(error(junk, {4}).find("test.json: model.path: cannot load '" + junk + "' as TorchScript"), std::string::npos)
      << error(junk, {4});
  EXPECT_EQ(error(ok, {4}), "(loaded)");
  const std::string shape_error = error(ok, {5});
  EXPECT_NE(shape_error.find("test.json: model.input_shape: a sample of this shape does not go through"), std::string::npos)
      << shape_error;
  EXPECT_EQ(shape_error.find('\n'), std::string::npos) << shape_error;
}

// A scripted layer that fails inside a step (not at load, where one sample goes through): the
// error names the stage and action and shows the interpreter's cause, not its generic header.
TEST(TorchScript, AnErrorInsideAStepShowsItsCause) {
  const std::string path = dir() + "/picky.pt";
  python("picky.py", R"(
import torch
class Picky(torch.nn.Module):
    def forward(self, x):
        if x.size(0) > 1:
            return torch.mm(x, torch.ones(3, 3))
        return x
torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 4), Picky(), torch.nn.Linear(4, 2))).save(")" + path + R"(")
)");
  models::Model m = load(path, {4});
  pipeline::PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 2;
  auto loss = [](const at::Tensor& out, const at::Tensor& t) { return torch::nn::functional::cross_entropy(out, t); };
  pipeline::Pipeline pipe(m.layers, o, loss);
  std::string shown;
  try {
    pipe.forward_backward(torch::randn({8, 4}), torch::zeros({8}, torch::kLong));
  } catch (const Error& e) {
    shown = e.what();
  }
  EXPECT_EQ(shown, "stage 1: forward(mb 0): mat1 and mat2 shapes cannot be multiplied (4x4 and 3x3) (in TorchScript)");
}

// examples/python_roundtrip.py with the project's venv: a network and data written in Python, trained
// by pipetrain on 2 stages, exported, loaded back by Python's load_state_dict, and evaluated by
// Python to the test loss and accuracy pipetrain reported.
TEST(TorchScript, ThePythonRoundTripExample) {
  const auto r = test::shell(std::string(PIPETRAIN_PYTHON) + " " + PIPETRAIN_SOURCE_DIR + "/examples/python_roundtrip.py " +
                             PIPETRAIN_BINARY + " " + dir() + "/roundtrip 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("round trip: equal"), std::string::npos) << r.out;
}

}  // namespace
