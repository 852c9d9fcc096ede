// Mixed precision beyond the equivalence grid (which checks bf16 steps against both references):
// the stage's dtypes (bfloat16 activations and wire tensors, float32 gradients), the autocast
// cache across optimizer steps, float16 loss scaling agreed by every rank, the config's rules and
// the precision a checkpoint records.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include <nlohmann/json.hpp>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "comm/transport.h"
#include "common/precision.h"
#include "common/rng.h"
#include "job/single_device.h"
#include "models/model.h"
#include "pipeline/loss_scale.h"
#include "pipeline/pipeline.h"
#include "profiler/profile.h"
#include "stages/autocast.h"
#include "stages/stage.h"
#include "checkpoint/checkpoint.h"
#include "job/config.h"
#include "train/trainer.h"
#include "tests/helpers.h"

using namespace pipetrain;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

models::Model mlp(double dropout = 0.1) {
  JsonReader r(json{{"family", "mlp"}, {"in", 12}, {"width", 16}, {"layers", 3}, {"out", 5}, {"dropout", dropout}},
               "model", "test");
  return models::build(r, /*seed=*/3);
}

TEST(Precision, NamesParseAndBytes) {
  EXPECT_EQ(precision_names(), (std::vector<std::string>{"fp32", "bf16", "fp16"}));
  for (const auto& n : precision_names()) EXPECT_EQ(precision_name(parse_precision(n)), n);
  EXPECT_EQ(precision_bytes(Precision::FP32), 4);
  EXPECT_EQ(precision_bytes(Precision::BF16), 2);
  try {
    parse_precision("fp8");
    FAIL() << "fp8 parsed";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("use fp32, bf16, fp16"), std::string::npos) << e.what();
  }
}

TEST(Precision, AutocastGuardRestoresTheThreadsState) {
  EXPECT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
  {
    stages::AutocastGuard g(Precision::BF16, torch::kCPU);
    EXPECT_TRUE(at::autocast::is_autocast_enabled(torch::kCPU));
    EXPECT_EQ(at::autocast::get_autocast_dtype(torch::kCPU), torch::kBFloat16);
    {
      stages::AutocastGuard none(Precision::FP32, torch::kCPU);  // changes nothing
      EXPECT_TRUE(at::autocast::is_autocast_enabled(torch::kCPU));
    }
    // Another thread has its own state.
    bool other = true;
    std::thread([&] { other = at::autocast::is_autocast_enabled(torch::kCPU); }).join();
    EXPECT_FALSE(other);
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
}

// A middle stage in bf16 takes and returns bfloat16 on the wire side (activation out, input
// gradient back) and leaves float32 gradients in its float32 parameters.
TEST(Precision, Bf16StageSpeaksBfloat16AndKeepsFloat32Gradients) {
  for (const std::string family : {"mlp", "gpt"}) {
    SCOPED_TRACE(family);
    const json cfg = family == "mlp" ? json{{"family", "mlp"}, {"in", 12}, {"width", 16}, {"layers", 3}, {"out", 5}}
                                     : json{{"family", "gpt"}, {"vocab_size", 11}, {"seq_len", 6}, {"d_model", 8},
                                            {"n_heads", 2}, {"n_layers", 2}, {"d_ff", 16}};
    JsonReader r(cfg, "model", "test");
    models::Model m = models::build(r, 1);
    // Stage 0: the first two layers; stage 1 of 3: the next one.
    torch::nn::Sequential first, middle;
    first->push_back(*(m.layers->begin()));
    first->push_back(*(m.layers->begin() + 1));
    middle->push_back(*(m.layers->begin() + 2));
    stages::Stage s0(0, 3, first, Recompute::Never), s1(1, 3, middle, Recompute::Always);
    s0.set_precision(Precision::BF16);
    s1.set_precision(Precision::BF16);
    s0.begin_step(0, 0, 1);
    s1.begin_step(0, 0, 1);
    const at::Tensor x = family == "mlp" ? torch::randn({4, 12}) : torch::randint(0, 11, {4, 6}, torch::kLong);
    const at::Tensor a = s0.forward(0, x, 0);
    EXPECT_EQ(a.scalar_type(), torch::kBFloat16);  // what stage 0 sends
    const at::Tensor b = s1.forward(0, a, 0);
    EXPECT_EQ(b.scalar_type(), torch::kBFloat16);
    const at::Tensor ga = s1.backward(0, torch::ones_like(b));  // recomputes, under autocast again
    EXPECT_EQ(ga.scalar_type(), torch::kBFloat16);  // what stage 1 sends back
    s0.backward(0, ga);
    for (auto* layers : {&first, &middle})
      for (const auto& p : (*layers)->parameters()) {
        ASSERT_TRUE(p.grad().defined());
        EXPECT_EQ(p.grad().scalar_type(), torch::kFloat);
      }
  }
}

// The reference of a few bf16 steps with SGD (lr): job::SingleDevice micro-batch by micro-batch
// under autocast, one intra-op thread as a stage's worker, the pipeline's dropout streams (seed 7).
void reference_steps(models::Model& m, const std::vector<std::pair<at::Tensor, at::Tensor>>& batches, int M,
                     double lr) {
  job::SingleDevice one(m.layers, pipetrain::test::mean_cross_entropy,
                        [lr](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, lr); },
                        /*seed=*/7, Precision::BF16);
  one.accumulate({M, 1.0, /*intra_op_threads=*/1});
  for (const auto& [x, y] : batches) one.train_step(x, y);
}

models::Model cnn() {
  JsonReader r(json{{"family", "cnn"}, {"image_size", 8}, {"channels", 2}, {"hidden", 8}, {"classes", 3},
                    {"dropout", 0.1}},
               "model", "test");
  return models::build(r, /*seed=*/3);
}

// Autocast caches the bfloat16 copy of each weight it casts whole (a convolution's, and a linear
// layer's through libtorch's linear op, which the model layers call). A stage's worker thread
// lives across steps: were the cache kept, the second step would convolve
// with the weights from before the first update (a large lr makes that a large difference).
TEST(Precision, NoWeightCastSurvivesAnOptimizerStep) {
  std::vector<std::pair<at::Tensor, at::Tensor>> batches;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  for (int i = 0; i < 3; ++i)
    batches.push_back({torch::randn({8, 1, 8, 8}, gen), torch::randint(0, 3, {8}, gen, torch::kLong)});
  models::Model ref = cnn();
  reference_steps(ref, batches, 4, 0.5);

  models::Model m = cnn();
  pipeline::PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 4;
  o.schedule = schedule::parse_kind("1f1b");
  o.seed = 7;
  o.precision = Precision::BF16;
  pipeline::Pipeline pipe(m.layers, o, pipetrain::test::mean_cross_entropy);
  pipe.optimizers().set([](auto params) { return std::make_unique<torch::optim::SGD>(params, 0.5); });
  for (const auto& [x, y] : batches) pipe.train_step(x, y);
  auto want = ref.layers->named_parameters();
  for (const auto& p : m.layers->named_parameters()) {
    EXPECT_EQ(p.value().scalar_type(), torch::kFloat) << p.key();
    EXPECT_LE(pipetrain::test::rel_error(p.value(), want[p.key()]), 1e-5) << p.key();
  }
}

// Every micro-batch reaches a weight through autocast's one cached copy, made by the step's first
// forward. From the second micro-batch on, that copy's backward node is older than all of the
// micro-batch's own, so the engine (newest first) would run it last: each weight's bfloat16
// gradient would wait for the whole backward, and a stage would hold all of them at once. With
// the casts run first, a later micro-batch's backward needs no more memory than the first's.
TEST(Precision, ALaterMicroBatchAccumulatesEachWeightGradientAsItGoes) {
  JsonReader r(json{{"family", "mlp"}, {"in", 256}, {"width", 256}, {"layers", 6}, {"out", 5}}, "model", "test");
  models::Model m = models::build(r, 5);
  stages::Stage stage(0, 1, m.layers, Recompute::Never);
  stage.set_loss(pipetrain::test::mean_cross_entropy);
  stage.set_precision(Precision::BF16);
  const int M = 4;
  const at::Tensor x = torch::randn({8 * M, 256}), y = torch::randint(0, 5, {8 * M}, torch::kLong);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);  // as a stage's worker
  std::vector<int64_t> transient;
  for (int step = 0; step < 3; ++step) {  // the first steps allocate the float32 gradients
    std::unique_ptr<profiler::MemoryCounter> counter;
    if (step == 2) counter = std::make_unique<profiler::MemoryCounter>();
    stage.begin_step(0, step, M);
    for (int mb = 0; mb < M; ++mb) stage.forward(mb, x.narrow(0, 8 * mb, 8), 8 * mb, y.narrow(0, 8 * mb, 8), 1.0 / M);
    for (int mb = 0; mb < M; ++mb) {
      if (counter) counter->reset_peak();
      const int64_t before = counter ? counter->live() : 0;
      stage.backward(mb, at::Tensor());
      if (counter) transient.push_back(counter->peak() - before);
    }
  }
  at::set_num_threads(threads);
  stages::clear_autocast_cache();
  // One hidden layer's bfloat16 weight: 128 KiB. Holding the six layers' would add 640 KiB more.
  const int64_t layer = 256 * 256 * 2;
  ASSERT_EQ(transient.size(), static_cast<size_t>(M));
  for (int mb = 1; mb < M; ++mb) EXPECT_LE(transient[mb], transient[0] + layer / 2) << "micro-batch " << mb;
}

TEST(Precision, APipelineRefusesReducedPrecisionOverNonFloat32Weights) {
  models::Model m = mlp();
  m.layers->to(torch::kDouble);
  pipeline::PipelineOptions o;
  o.stages = 2;
  o.precision = Precision::BF16;
  try {
    pipeline::Pipeline pipe(m.layers, o, pipetrain::test::mean_cross_entropy);
    FAIL() << "a float64 model ran in bf16";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("float32 master weights"), std::string::npos) << e.what();
  }
}

// ---- fp16 loss scaling ------------------------------------------------------------------------

TEST(LossScaler, BacksOffOnOverflowAndGrowsAfterTheInterval) {
  pipeline::LossScaleOptions o;
  o.initial = 1024;
  o.growth_interval = 3;
  pipeline::LossScaler s(o);
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.update(false), 1024);
  EXPECT_EQ(s.update(false), 1024);
  EXPECT_EQ(s.update(false), 2048);  // three good steps
  EXPECT_EQ(s.good_steps(), 0);
  EXPECT_EQ(s.update(false), 2048);
  EXPECT_EQ(s.update(true), 1024);  // an overflow halves it and restarts the count
  EXPECT_EQ(s.good_steps(), 0);
  EXPECT_EQ(s.update(false), 1024);
  EXPECT_EQ(s.update(false), 1024);
  EXPECT_EQ(s.update(false), 2048);
  o.min_scale = 256;
  pipeline::LossScaler floor(o);
  for (int i = 0; i < 10; ++i) floor.update(true);
  EXPECT_EQ(floor.scale(), 256);
  s.restore(8, 2);
  EXPECT_EQ(s.update(false), 16);
  EXPECT_THROW(s.restore(0, 0), ConfigError);
  EXPECT_THROW(s.restore(std::numeric_limits<double>::infinity(), 0), ConfigError);
  o.backoff = 1.5;
  EXPECT_THROW(pipeline::LossScaler bad(o), ConfigError);
}

// Multiplies the gradient that passes back through it by infinity while `armed`: a float16
// overflow on demand, in the stage that holds it.
std::atomic<bool> g_armed{false};
struct BlowUpFn : torch::autograd::Function<BlowUpFn> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list g) {
    return {g_armed ? g[0] * std::numeric_limits<float>::infinity() : g[0]};
  }
};
struct BlowUpImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x) { return BlowUpFn::apply(x); }
};
TORCH_MODULE(BlowUp);

// fc1 | blow-up, fc2, head: the overflow happens in stage 1's backward, but only stage 0's
// gradients hold it (stage 1's own parameters sit after it).
torch::nn::Sequential blow_up_model() {
  models::Model m = mlp(0.0);
  torch::nn::Sequential s;
  auto it = m.layers->begin();
  s->push_back("fc1", *it);
  s->push_back("blow_up", BlowUp());
  for (++it; it != m.layers->end(); ++it) s->push_back(*it);
  return s;
}

// Two ranks (threads here, each with its own endpoint, as processes run them) train in fp16; on
// the armed step only rank 0's gradients overflow, yet both ranks skip the update and back off
// the scale; the others apply it, and the scale grows after growth_interval good steps.
TEST(Fp16, AnOverflowOnOneRankSkipsTheStepOnEveryRank) {
  constexpr int K = 2, kSteps = 5, kArmed = 1;
  pipeline::PipelineOptions o;
  o.stages = K;
  o.micro_batches = 2;
  o.balance = {2, 3};
  o.precision = Precision::FP16;
  o.loss_scale.initial = 1024;
  o.loss_scale.growth_interval = 2;
  o.timeout_s = 60;
  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < K; ++r) models.push_back(blow_up_model());
  auto endpoints = comm::make_transport_group(o.transport, K);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  std::vector<std::pair<at::Tensor, at::Tensor>> batches;
  for (int i = 0; i < kSteps; ++i) batches.push_back({torch::randn({8, 12}, gen), torch::randint(0, 5, {8}, gen, torch::kLong)});
  // Per rank and step: skipped, the scale after the step, and whether its own parameters changed.
  std::vector<std::vector<bool>> skipped(K, std::vector<bool>(kSteps)), changed(K, std::vector<bool>(kSteps));
  std::vector<std::vector<double>> scale(K, std::vector<double>(kSteps));
  std::vector<std::unique_ptr<pipeline::Pipeline>> pipes(K);
  std::vector<std::string> errors(K);
  std::vector<std::thread> threads;
  for (int r = 0; r < K; ++r)
    threads.emplace_back([&, r] {
      try {
        pipes[r] = std::make_unique<pipeline::Pipeline>(models[r], o, pipetrain::test::mean_cross_entropy, std::move(endpoints[r]));
        pipes[r]->optimizers().set([](auto params) { return std::make_unique<torch::optim::SGD>(params, 0.1); });
        for (int s = 0; s < kSteps; ++s) {
          std::vector<at::Tensor> before;
          for (int vs = 0; vs < K; ++vs)
            if (pipes[r]->is_local_stage(vs))
              for (auto& p : pipes[r]->stage_layers(vs)->parameters()) before.push_back(p.detach().clone());
          if (r == 1) g_armed = s == kArmed;  // only rank 1 runs the blow-up layer
          pipes[r]->train_step(batches[s].first, batches[s].second);
          skipped[r][s] = pipes[r]->optimizers().last_step_skipped();
          scale[r][s] = pipes[r]->optimizers().loss_scale();
          size_t i = 0;
          bool any = false;
          for (int vs = 0; vs < K; ++vs)
            if (pipes[r]->is_local_stage(vs))
              for (auto& p : pipes[r]->stage_layers(vs)->parameters()) any |= !torch::equal(p, before[i++]);
          changed[r][s] = any;
        }
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  g_armed = false;
  for (int r = 0; r < K; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  for (int r = 0; r < K; ++r)
    for (int s = 0; s < kSteps; ++s) {
      SCOPED_TRACE(::testing::Message() << "rank " << r << " step " << s);
      EXPECT_EQ(skipped[r][s], s == kArmed);
      EXPECT_EQ(changed[r][s], s != kArmed);
    }
  // 1024 -> step 0 good (1 of 2) -> step 1 overflow: 512 -> steps 2, 3 good: 1024 -> step 4: 1024.
  const std::vector<double> want{1024, 512, 512, 1024, 1024};
  EXPECT_EQ(scale[0], want);
  EXPECT_EQ(scale[1], want);
}

// Scaling is exact: a step in fp16 with the loss scaled by 2^k and the gradients divided by it
// equals the same step computed with the scale applied by hand (powers of two change no bit),
// and the loss it returns is the unscaled one.
TEST(Fp16, AScaledStepEqualsTheReferenceWithTheSameScale) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const at::Tensor x = torch::randn({8, 12}, gen), y = torch::randint(0, 5, {8}, gen, torch::kLong);
  constexpr double S = 4096;
  models::Model ref = mlp(0.0);
  job::SingleDevice one(ref.layers, pipetrain::test::mean_cross_entropy, {}, /*seed=*/0, Precision::FP16);
  one.accumulate({2, S, /*intra_op_threads=*/1});
  const double ref_loss = one.forward_backward(x, y);
  models::Model m = mlp(0.0);
  pipeline::PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 2;
  o.precision = Precision::FP16;
  o.loss_scale.initial = S;
  pipeline::Pipeline pipe(m.layers, o, pipetrain::test::mean_cross_entropy);
  pipe.optimizers().set([](auto params) { return std::make_unique<torch::optim::SGD>(params, 1.0); });
  std::vector<at::Tensor> before;
  for (auto& p : m.layers->parameters()) before.push_back(p.detach().clone());
  const double loss = pipe.train_step(x, y);
  EXPECT_NEAR(loss, ref_loss, 1e-6 * std::abs(ref_loss));
  EXPECT_FALSE(pipe.optimizers().last_step_skipped());
  size_t i = 0;
  auto want = ref.layers->parameters();
  for (auto& p : m.layers->parameters()) {
    // SGD with lr 1: the update is minus the unscaled gradient.
    const at::Tensor step = before[i] - p.detach();
    EXPECT_LE(pipetrain::test::rel_error(step, want[i].grad() / S), 1e-6) << i;
    ++i;
  }
}

// ---- the run layer ----------------------------------------------------------------------------

json small_config() {
  return json::parse(R"({
    "model": {"family": "mlp", "in": 12, "width": 16, "layers": 3, "out": 5},
    "data": {"kind": "synthetic", "batch_size": 8, "samples": 64, "test_samples": 16},
    "pipeline": {"stages": 2, "micro_batches": 2},
    "optimizer": {"kind": "adam", "lr": 0.01},
    "train": {"steps": 4, "seed": 1}
  })");
}

std::string config_error(json j) {
  try {
    job::parse_config(j, "test.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(PrecisionConfig, DefaultsToFp32AndRefusesFp16OnTheCpuAndFloat64) {
  EXPECT_EQ(job::parse_config(small_config(), "test.json").train.precision, Precision::FP32);
  json j = small_config();
  j["train"]["precision"] = "bf16";
  EXPECT_EQ(job::parse_config(j, "test.json").train.precision, Precision::BF16);
  j["train"]["precision"] = "fp16";
  const std::string fp16 = config_error(j);
  EXPECT_NE(fp16.find("test.json: train.precision: fp16 is for GPU stages only"), std::string::npos) << fp16;
  EXPECT_NE(fp16.find("use bf16"), std::string::npos) << fp16;
  j["train"]["precision"] = "half";
  EXPECT_NE(config_error(j).find("train.precision"), std::string::npos) << config_error(j);
  j["train"]["precision"] = "bf16";
  j["runtime"]["dtype"] = "float64";
  const std::string f64 = config_error(j);
  EXPECT_NE(f64.find("runtime.dtype"), std::string::npos) << f64;
  EXPECT_NE(f64.find("float32"), std::string::npos) << f64;
}

struct Notes : train::TrainObserver {
  std::vector<std::string> notes;
  void note(const std::string& text) override { notes.push_back(text); }
};

// A checkpoint records its precision; resuming it in another precision works and says so, and
// a manifest whose precision is not one of ours is refused.
TEST(PrecisionConfig, ACheckpointRecordsItsPrecisionAndAResumeInAnotherSaysSo) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("pipetrain_precision_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  json j = small_config();
  j["train"]["checkpoint_dir"] = dir.string();
  {
    job::Job job = job::prepare(job::parse_config(j, "test.json"));
    train::TrainOptions o;
    o.until_step = 2;
    train::train(job, o);
  }
  const std::string ckpt = checkpoint::latest_checkpoint(dir.string());
  ASSERT_FALSE(ckpt.empty());
  json manifest = json::parse(std::ifstream(fs::path(ckpt) / "manifest.json"));
  EXPECT_EQ(manifest.at("precision"), "fp32");

  j["train"]["precision"] = "bf16";
  job::Job job = job::prepare(job::parse_config(j, "test.json"));
  Notes notes;
  train::TrainOptions o;
  o.resume = true;
  o.observers = {&notes};
  const train::TrainResult r = train::train(job, o);
  EXPECT_EQ(r.first_step, 2);
  EXPECT_EQ(r.losses.size(), 2u);
  bool said = false;
  for (const auto& n : notes.notes) said |= n.find("trained in fp32, in bf16") != std::string::npos;
  EXPECT_TRUE(said) << ::testing::PrintToString(notes.notes);
  manifest = json::parse(std::ifstream(fs::path(checkpoint::latest_checkpoint(dir.string())) / "manifest.json"));
  EXPECT_EQ(manifest.at("precision"), "bf16");
  fs::remove_all(dir);
}

}  // namespace
