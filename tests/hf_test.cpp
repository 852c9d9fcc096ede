// The hf family against transformers itself (tests/hf_models.py makes the models and computes
// transformers' results): for each architecture, in float32 and float64, the logits of a pipeline
// of 1 and 3 stages equal transformers' (1e-5, 1e-10); 5 steps of plain SGD on one batch on 3
// stages give transformers' losses, and the weights written by save_hf, loaded with
// from_pretrained, equal transformers' trained weights. Each case prints its largest differences
// ("parity ..." lines: the table of docs/models.md). Skipped where the project's Python has no
// transformers (scripts/setup.sh installs it).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "job/npy.h"
#include "models/hf.h"
#include "models/model.h"
#include "pipeline/pipeline.h"
#include "tests/hf_oracle.h"
#include "tests/process_helpers.h"

using namespace pipetrain;

namespace {

using test::has_transformers;
using test::python;

std::string root() { return test::scratch_dir("hf"); }

at::Tensor load_npy(const std::string& file) {
  const job::NpyHeader h = job::read_npy_header(file);
  const at::ScalarType type = h.descr == "'<i8'" ? at::kLong : h.descr == "'<f8'" ? at::kDouble : at::kFloat;
  return job::map_file(file, h.offset, h.shape, type).clone();
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

at::Tensor ce(const at::Tensor& out, const at::Tensor& target) {
  return torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}), target.reshape({-1}));
}

models::Model build(const std::string& dir, int64_t seq_len) {
  const nlohmann::json j{{"family", "hf"}, {"path", dir}, {"seq_len", seq_len}};
  JsonReader r(j, "model", "test");
  return models::build(r, 0);
}

pipeline::PipelineOptions options(const models::Model& m, int stages) {
  pipeline::PipelineOptions o;
  o.stages = stages;
  o.micro_batches = 2;
  o.ties = m.ties;
  return o;
}

// Every check of one architecture, both precisions.
void check_architecture(const std::string& arch) {
  if (!has_transformers()) GTEST_SKIP() << "the project's Python has no transformers (scripts/setup.sh installs it)";
  const auto made = test::shell(python() + " " + test::hf_oracle() + " make " + root() + " " + arch + " 2>&1");
  ASSERT_EQ(made.status, 0) << made.out;
  for (const std::string dtype : {"float32", "float64"}) {
    const std::string dir = root() + "/" + arch + "-" + dtype;
    const double tol = dtype == "float64" ? 1e-10 : 1e-5;
    const at::Tensor tokens = load_npy(dir + "/tokens.npy"), expected = load_npy(dir + "/logits.npy");
    const int64_t T = tokens.size(1) - 1;
    const at::Tensor x = tokens.narrow(1, 0, T).contiguous(), y = tokens.narrow(1, 1, T).contiguous();
    for (int stages : {1, 3}) {
      models::Model m = build(dir + "/model", T);
      ASSERT_EQ(m.layers->parameters()[0].scalar_type(), dtype == "float64" ? at::kDouble : at::kFloat);
      pipeline::Pipeline pipe(m.layers, options(m, stages), ce);
      const at::Tensor logits = pipe.predict(x);
      const double d = max_diff(logits, expected);
      std::printf("parity %s %s stages=%d logits=%.3g\n", arch.c_str(), dtype.c_str(), stages, d);
      EXPECT_LE(d, tol) << arch << " " << dtype << " on " << stages << " stages";
    }
    // Training: 5 SGD steps on one batch, 3 stages, then the weights exported.
    models::Model m = build(dir + "/model", T);
    pipeline::Pipeline pipe(m.layers, options(m, 3), ce);
    pipe.optimizers().set([](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 0.1); });
    const at::Tensor losses = load_npy(dir + "/losses.npy");
    double worst = 0;
    for (int64_t s = 0; s < losses.size(0); ++s) {
      const double loss = pipe.train_step(x, y);
      worst = std::max(worst, std::abs(loss - losses[s].item<double>()));
    }
    std::printf("parity %s %s stages=3 sgd5-loss=%.3g\n", arch.c_str(), dtype.c_str(), worst);
    EXPECT_LE(worst, dtype == "float64" ? 1e-10 : 1e-5) << arch << " " << dtype << " losses";
    std::map<std::string, at::Tensor> weights;
    for (const auto& p : m.layers->named_parameters()) weights[p.key()] = p.value();
    EXPECT_GT(models::save_hf(dir + "/model", weights, dir + "/exported", 1 << 20), 0u);
  }
  const auto compared = test::shell(python() + " " + test::hf_oracle() + " compare " + root() + " 2>/dev/null");
  ASSERT_EQ(compared.status, 0) << compared.out;
  const nlohmann::json result = nlohmann::json::parse(compared.out.substr(compared.out.find('{')));
  for (const std::string dtype : {"float32", "float64"}) {
    const std::string name = arch + "-" + dtype;
    ASSERT_TRUE(result.contains(name) && result[name].is_number()) << compared.out;
    const double d = result[name].get<double>();
    std::printf("parity %s %s exported-vs-trained=%.3g\n", arch.c_str(), dtype.c_str(), d);
    EXPECT_LE(d, dtype == "float64" ? 1e-10 : 1e-5) << name;
  }
}

}  // namespace

TEST(HfParity, Llama) { check_architecture("llama"); }
TEST(HfParity, Llama3RopeTiedWithBiases) { check_architecture("llama3-tied"); }
TEST(HfParity, MistralSlidingWindow) { check_architecture("mistral"); }
TEST(HfParity, Qwen2) { check_architecture("qwen2"); }
TEST(HfParity, Gpt2) { check_architecture("gpt2"); }
