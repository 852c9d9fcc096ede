// The C++ package as an embedding program meets it: the per-thread state its headers reach (the
// skip context, the recomputation flag, the memory account) is one object per thread, defined in
// the library (tests/install_example.sh checks the same across compilers); the deprecated
// spellings of 0.1.0 still work (CHANGELOG.md); where the gradient is after forward_backward with
// a sharded optimizer; and the CPU's bf16 report and the warning a bf16 job gets without it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/memory_account.h"
#include "common/recompute.h"
#include "common/skip.h"
#include "job/config.h"
#include "job/job.h"
#include "job/runtime.h"
#include "models/skip.h"
#include "pipeline/pipeline.h"
#include "profiler/profile.h"
#include "stages/accelerator.h"
#include "tests/helpers.h"

using namespace pipetrain;

namespace {

// ---- per-thread state ---------------------------------------------------------------------------

// A scope opened here is the one stash() and pop() see; scopes nest; another value type and
// another thread have contexts of their own.
TEST(SkipContext, ScopesNestPerValueTypeAndThread) {
  EXPECT_EQ(SkipScope<at::Tensor>::current(), nullptr);
  {
    models::TensorSkipScope outer;
    models::stash("a", torch::ones({1}));
    {
      SkipScope<int> ints;
      stash_skip<int>("a", 7);  // its own context: no clash with the tensor named "a"
      models::TensorSkipScope inner;
      EXPECT_THROW(models::pop("a"), Error);  // the inner scope hides the outer one
      EXPECT_EQ(pop_skip<int>("a"), 7);
    }
    EXPECT_EQ(models::pop("a").item<float>(), 1.0f);
    std::thread([] {
      try {
        models::stash("b", torch::ones({1}));
        ADD_FAILURE() << "another thread saw this thread's context";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("no skip context is open on this thread"), std::string::npos) << e.what();
      }
    }).join();
  }
  EXPECT_EQ(SkipScope<at::Tensor>::current(), nullptr);
  EXPECT_EQ(SkipScope<int>::current(), nullptr);
}

TEST(ThreadState, RecomputingAndTheMemoryAccountArePerThread) {
  EXPECT_FALSE(recomputing());
  {
    RecomputeGuard g;
    EXPECT_TRUE(recomputing());
    std::thread([] { EXPECT_FALSE(recomputing()); }).join();
  }
  EXPECT_FALSE(recomputing());
  memory_account() = 3;
  std::thread([] { EXPECT_EQ(memory_account(), -1); }).join();
  EXPECT_EQ(memory_account(), 3);
  memory_account() = -1;
}

// ---- deprecated spellings -----------------------------------------------------------------------

torch::nn::Sequential small_model() {
  torch::manual_seed(5);
  torch::nn::Sequential s(torch::nn::Linear(6, 8), torch::nn::Functional(torch::tanh), torch::nn::Linear(8, 3));
  s->to(torch::kDouble);
  return s;
}

pipeline::OptimizerFactory sgd() {
  return [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.5).momentum(0.9));
  };
}

// The 0.1.0 spellings kept for one version forward to optimizers(): the same steps, bit for bit.
TEST(Deprecated, TheOldOptimizerSpellingsForwardToOptimizers) {
  pipeline::PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 2;
  o.timeout_s = 60;
  torch::nn::Sequential old_model = small_model(), new_model = small_model();
  pipeline::Pipeline old_pipe(old_model, o, pipetrain::test::mean_cross_entropy), new_pipe(new_model, o, pipetrain::test::mean_cross_entropy);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  old_pipe.set_optimizer(sgd());
  old_pipe.set_grad_clip(0.05);
  old_pipe.set_learning_rate(0.1);
#pragma GCC diagnostic pop
  new_pipe.optimizers().set(sgd());
  new_pipe.optimizers().set_grad_clip(0.05);
  new_pipe.optimizers().set_learning_rate(0.1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
  for (int s = 0; s < 3; ++s) {
    const at::Tensor x = torch::randn({8, 6}, gen).to(torch::kDouble), y = torch::randint(0, 3, {8}, gen, torch::kLong);
    EXPECT_EQ(old_pipe.forward_backward(x, y), new_pipe.forward_backward(x, y));
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    const double old_norm = old_pipe.step_optimizer();
#pragma GCC diagnostic pop
    EXPECT_EQ(old_norm, new_pipe.optimizers().step());
    EXPECT_GT(old_norm, 0.05);  // the clip applied
  }
  EXPECT_DOUBLE_EQ(old_pipe.optimizers().of(0)->param_groups()[0].options().get_lr(), 0.1);
  auto n = new_model->named_parameters();
  for (const auto& p : old_model->named_parameters()) EXPECT_TRUE(torch::equal(p.value(), n[p.key()])) << p.key();
}

// ---- a sharded optimizer's gradients ------------------------------------------------------------

pipeline::PipelineOptions copies(bool shard) {
  pipeline::PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 2;
  o.data_parallel = 2;
  o.shard_optimizer = shard;
  o.timeout_s = 60;
  return o;
}

// forward_backward leaves .grad undefined with a sharded optimizer (what pipeline.h says);
// gather_grads() then puts the whole reduced gradient there, equal to the unsharded copies'
// (and to one device's), and the step that follows is the unsharded one.
TEST(ShardedGrads, GatherGradsPutsTheWholeReducedGradientInDotGrad) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor x = torch::randn({12, 6}, gen).to(torch::kDouble), y = torch::randint(0, 3, {12}, gen, torch::kLong);
  torch::nn::Sequential one = small_model(), plain_model = small_model(), sharded_model = small_model();
  const at::Tensor want_loss = pipetrain::test::mean_cross_entropy(one->forward(x), y);
  want_loss.backward();
  pipeline::Pipeline plain(plain_model, copies(false), pipetrain::test::mean_cross_entropy), sharded(sharded_model, copies(true), pipetrain::test::mean_cross_entropy);
  plain.optimizers().set(sgd());
  sharded.optimizers().set(sgd());
  ASSERT_TRUE(sharded.optimizers().sharded());
  EXPECT_NEAR(sharded.forward_backward(x, y), want_loss.item<double>(), 1e-12);
  plain.forward_backward(x, y);
  for (const auto& p : sharded_model->parameters()) EXPECT_FALSE(p.grad().defined());
  sharded.optimizers().gather_grads();
  plain.optimizers().gather_grads();  // not sharded: nothing to do
  auto w = one->named_parameters(), u = plain_model->named_parameters();
  for (const auto& p : sharded_model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    const at::Tensor& want = w[p.key()].grad();
    EXPECT_LT((p.value().grad() - want).norm().item<double>(), 1e-10 * want.norm().item<double>()) << p.key();
    EXPECT_TRUE(torch::allclose(p.value().grad(), u[p.key()].grad(), 1e-12, 1e-14)) << p.key();
  }
  plain.optimizers().step();
  sharded.optimizers().step();
  for (const auto& p : sharded_model->named_parameters())
    EXPECT_TRUE(torch::allclose(p.value(), u[p.key()], 1e-12, 1e-14)) << p.key();
}

// ---- bf16 on a CPU without the instructions for it ----------------------------------------------

TEST(CpuBf16, TheFlagsSayWhetherBf16IsFast) {
  const std::string epyc_avx2 = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx avx2 fma\n";
  stages::CpuInfo c = stages::cpu_info_from(epyc_avx2);
  EXPECT_EQ(c.model, "AMD EPYC 7B13");
  EXPECT_TRUE(c.flags_known);
  EXPECT_FALSE(c.fast_bf16());
  c = stages::cpu_info_from("model name : X\nflags : avx2 avx512f avx512_bf16 avx512_vnni\n");
  EXPECT_TRUE(c.avx512_bf16);
  EXPECT_FALSE(c.amx_bf16);
  EXPECT_TRUE(c.fast_bf16());
  c = stages::cpu_info_from("flags : avx2 amx_tile amx_bf16 amx_int8\n");
  EXPECT_TRUE(c.amx_bf16);
  EXPECT_TRUE(c.fast_bf16());
  // A flag is a whole word: avx512_bf16x or xamx_bf16 are not it.
  EXPECT_FALSE(stages::cpu_info_from("flags : avx512_bf16x xamx_bf16\n").fast_bf16());
  // No flags line (not Linux, or a trimmed /proc): nothing known, no warning.
  c = stages::cpu_info_from("model name : Y\n");
  EXPECT_FALSE(c.flags_known);
  EXPECT_EQ(stages::slow_bf16_warning(c), "");

  EXPECT_EQ(stages::slow_bf16_warning(stages::cpu_info_from("flags : avx512_bf16\n")), "");
  const std::string w = stages::slow_bf16_warning(stages::cpu_info_from(epyc_avx2), 0.0712);
  EXPECT_EQ(w,
            "precision bf16 on a CPU stage, but this CPU (AMD EPYC 7B13) has neither AVX-512 BF16 nor AMX: a matrix "
            "product measured here ran 0.07x the float32 speed (train.precision fp32 avoids it)");
  EXPECT_EQ(w.find('\n'), std::string::npos);
  EXPECT_NE(stages::slow_bf16_warning(stages::cpu_info_from(epyc_avx2)).find("expect it slower than float32"),
            std::string::npos);
}

// Sets an environment variable for a scope (the previous value after).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

nlohmann::json bf16_config(const std::string& precision) {
  auto j = nlohmann::json::parse(R"({
    "model": {"family": "mlp", "in": 12, "width": 16, "layers": 3, "out": 5},
    "data": {"kind": "synthetic", "batch_size": 8, "samples": 64, "test_samples": 16},
    "pipeline": {"stages": 2, "micro_batches": 2},
    "train": {"steps": 1, "seed": 1}
  })");
  j["train"]["precision"] = precision;
  return j;
}

std::vector<std::string> notes_of_pipeline(const nlohmann::json& config) {
  job::Job job = job::prepare(job::parse_config(config, "test.json"));
  std::vector<std::string> notes;
  job::make_pipeline(job, "", [&](const std::string& n) { notes.push_back(n); });
  return notes;
}

bool has_bf16_warning(const std::vector<std::string>& notes) {
  for (const auto& n : notes)
    if (n.rfind("warning: precision bf16 on a CPU stage", 0) == 0 && n.find("has neither AVX-512 BF16 nor AMX") != std::string::npos &&
        n.find("the float32 speed") != std::string::npos)
      return true;
  return false;
}

// A bf16 job on CPU stages is warned, with the measured speed, where the CPU lacks both (here
// told so by PIPETRAIN_CPU_FLAGS); not where it has one, nor in fp32.
TEST(CpuBf16, ABf16JobIsWarnedOnlyWhereTheCpuLacksBf16) {
  {
    ScopedEnv flags("PIPETRAIN_CPU_FLAGS", "fpu sse2 avx avx2 fma");
    EXPECT_FALSE(stages::cpu_info().fast_bf16());
    EXPECT_TRUE(has_bf16_warning(notes_of_pipeline(bf16_config("bf16"))));
    EXPECT_FALSE(has_bf16_warning(notes_of_pipeline(bf16_config("fp32"))));
  }
  {
    ScopedEnv flags("PIPETRAIN_CPU_FLAGS", "avx2 avx512_bf16");
    EXPECT_FALSE(has_bf16_warning(notes_of_pipeline(bf16_config("bf16"))));
  }
  {
    ScopedEnv flags("PIPETRAIN_CPU_FLAGS", "avx2 amx_bf16");
    EXPECT_FALSE(has_bf16_warning(notes_of_pipeline(bf16_config("bf16"))));
  }
  EXPECT_GT(profiler::bf16_speed(1), 0);
}

}  // namespace
