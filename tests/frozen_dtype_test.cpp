// model.frozen_dtype (models/model.h: store_frozen): frozen Linear weights kept in bfloat16 under
// train.precision bf16. A language model of two LoRA blocks (every projection adapted, the base
// projections and the head frozen) trains bit for bit as with its frozen weights in float32 (the
// losses, every adapter, the frozen weights the float32 ones rounded, unchanged), on 2 stages and
// on one device; the profile shows the bytes it saves (the frozen weights' own and the casts
// each micro-batch kept for its backward); bad settings are one-line errors; from the command
// line a run resumes exactly from its checkpoint and generates from it.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "checkpoint/shard.h"
#include "common/error.h"
#include "job/config.h"
#include "job/job.h"
#include "job/single_device.h"
#include "models/model.h"
#include "pipeline/pipeline.h"
#include "profiler/profile.h"
#include "schedule/kinds.h"
#include "tests/hf_oracle.h"

using namespace pipetrain;

namespace {

std::string work_dir() { return test::scratch_dir("frozen_dtype"); }

// Token ids for data.kind "tokens" (uint16), made once per process.
std::string tokens_file() {
  const std::string path = work_dir() + "/tokens.bin";
  if (!std::filesystem::exists(path)) {
    std::vector<uint16_t> ids(3000);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>((i * 7 + i / 13) % 32);
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 2));
  }
  return path;
}

nlohmann::json block(const std::string& name) {
  return {{"name", name}, {"type", "llama_block"}, {"d_model", 32}, {"n_heads", 4}, {"n_kv_heads", 2}, {"d_ff", 48},
          {"lora_rank", 4}, {"lora_targets", "all"}};
}

// A config of the model; `model` over its model section's keys.
nlohmann::json config(const nlohmann::json& model, const std::string& precision = "bf16") {
  nlohmann::json m{{"family", "layers"},
                   {"input_shape", {8}},
                   {"input_dtype", "long"},
                   {"layers", {{{"name", "e"}, {"type", "embedding"}, {"num_embeddings", 32}, {"embedding_dim", 32}},
                               block("b0"),
                               block("b1"),
                               {{"name", "n"}, {"type", "rmsnorm"}, {"normalized_shape", 32}},
                               {{"name", "head"}, {"type", "linear"}, {"in_features", 32}, {"out_features", 32}, {"bias", false}}}},
                   {"freeze", {"b*_proj.weight", "head.*"}}};
  if (model.is_object()) m.update(model);
  return {{"model", m},
          {"data", {{"kind", "tokens"}, {"path", tokens_file()}, {"dtype", "uint16"}, {"batch_size", 8}, {"stride", 8}}},
          {"pipeline", {{"stages", 2}, {"micro_batches", 4}, {"schedule", "1f1b"}}},
          {"optimizer", {{"kind", "adamw"}, {"lr", 0.01}, {"weight_decay", 0.1}}},
          {"train", {{"steps", 4}, {"precision", precision}, {"seed", 3}, {"checkpoint_every", 2}}}};
}

models::Model build(const nlohmann::json& model, const std::string& precision = "bf16") {
  return job::build_model(job::parse_config(config(model, precision), "frozen.json"));
}

std::string build_error(const nlohmann::json& model, const std::string& precision = "bf16") {
  try {
    build(model, precision);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(built)";
}

at::Tensor ce(const at::Tensor& out, const at::Tensor& target) {
  return torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}).to(at::kFloat), target.reshape({-1}));
}

std::unique_ptr<torch::optim::Optimizer> adamw(std::vector<at::Tensor> p) {
  return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
}

bool is_frozen_projection(const std::string& name) {
  return name == "head.linear.weight" || (name.size() > 12 && name.compare(name.size() - 12, 12, "_proj.weight") == 0);
}

}  // namespace

TEST(FrozenDtype, StepsAsFloat32FrozenWeightsUnderAutocastWould) {
  models::Model low = build({{"frozen_dtype", "bf16"}}), wide = build({});
  const auto lows = low.layers->named_parameters(), wides = wide.layers->named_parameters();
  size_t frozen = 0;
  for (const auto& p : wides) {
    const at::Tensor& l = lows[p.key()];
    if (is_frozen_projection(p.key())) {
      ++frozen;
      EXPECT_EQ(l.scalar_type(), at::kBFloat16) << p.key();
      EXPECT_TRUE(torch::equal(l, p.value().to(at::kBFloat16))) << p.key();
    } else {
      EXPECT_EQ(l.scalar_type(), at::kFloat) << p.key() << " (trains, or is no Linear's weight)";
      EXPECT_TRUE(torch::equal(l, p.value())) << p.key();
    }
  }
  EXPECT_EQ(frozen, 2u * 7 + 1);  // every projection of both blocks, and the head
  std::map<std::string, at::Tensor> before;
  for (const auto& p : lows) before[p.key()] = p.value().clone();

  torch::manual_seed(7);
  const at::Tensor x = torch::randint(0, 32, {8, 8}), y = torch::randint(0, 32, {8, 8});
  pipeline::PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 4;
  o.precision = Precision::BF16;
  o.seed = 3;
  pipeline::Pipeline a(low.layers, o, ce), b(wide.layers, o, ce);
  a.optimizers().set(adamw);
  b.optimizers().set(adamw);
  models::Model one = build({{"frozen_dtype", "bf16"}});
  job::SingleDevice single(one.layers, ce, adamw, 3, Precision::BF16, one.ties);
  single.accumulate({4, 1, 0});
  for (int s = 0; s < 3; ++s) {
    const double la = a.train_step(x, y), lb = b.train_step(x, y);
    EXPECT_EQ(la, lb) << "step " << s;
    EXPECT_NEAR(single.train_step(x, y), la, 1e-5) << "step " << s << " on one device";
  }
  for (const auto& p : wides) {
    const at::Tensor& l = lows[p.key()];
    if (is_frozen_projection(p.key())) {
      EXPECT_TRUE(torch::equal(l, before.at(p.key()))) << p.key() << " is frozen";
    } else {
      EXPECT_TRUE(torch::equal(l, p.value())) << p.key() << " trained as with float32 frozen weights";
      if (p.value().requires_grad()) EXPECT_FALSE(torch::equal(l, before.at(p.key()))) << p.key() << " trains";
    }
  }
}

// Every kind of schedule and recomputation: a split backward (ZB-H1, the frozen weights without a
// W pass), interleaved chunks, recomputed forwards: the losses and the trained parameters bit for bit
// those of float32 frozen weights.
TEST(FrozenDtype, EveryScheduleAndRecomputationStepsAsWithFloat32FrozenWeights) {
  using schedule::Kind;
  const std::vector<std::pair<Kind, Recompute>> cases{
      {Kind::ZbH1, Recompute::Never}, {Kind::Interleaved1F1B, Recompute::Always}, {Kind::GPipe, Recompute::ExceptLast}, {Kind::OneFOneB, Recompute::Always}};
  torch::manual_seed(7);
  const at::Tensor x = torch::randint(0, 32, {8, 8}), y = torch::randint(0, 32, {8, 8});
  for (const auto& [kind, rc] : cases) {
    const std::string what = std::string(schedule::name(kind)) + " " + recompute_name(rc);
    models::Model low = build({{"frozen_dtype", "bf16"}}), wide = build({});
    pipeline::PipelineOptions o;
    o.schedule = kind;
    o.chunks = schedule::info(kind).default_chunks;
    o.stages = 2;
    o.micro_batches = 4;
    o.recompute = rc;
    o.precision = Precision::BF16;
    pipeline::Pipeline a(low.layers, o, ce), b(wide.layers, o, ce);
    a.optimizers().set(adamw);
    b.optimizers().set(adamw);
    for (int s = 0; s < 2; ++s) EXPECT_EQ(a.train_step(x, y), b.train_step(x, y)) << what << " step " << s;
    const auto lows = low.layers->named_parameters();
    for (const auto& p : wide.layers->named_parameters())
      if (p.value().requires_grad()) EXPECT_TRUE(torch::equal(lows[p.key()], p.value())) << what << " " << p.key();
  }
}

// The plan's costs: a block's parameter bytes lose 2 of every frozen projection value's 4, and
// what its forward keeps for the backward loses the bfloat16 casts of those weights.
TEST(FrozenDtype, TheProfileCountsTheBytesItSaves) {
  models::Model low = build({{"frozen_dtype", "bf16"}}), wide = build({});
  torch::manual_seed(7);
  const at::Tensor x = torch::randint(0, 32, {2, 8}), y = torch::randint(0, 32, {2, 8});
  profiler::ProfileOptions po;
  po.warmup = 0;
  po.repeat = 1;
  po.precision = Precision::BF16;
  const profiler::Profile pl = profiler::profile_layers(low.layers, x, y, ce, po);
  const profiler::Profile pw = profiler::profile_layers(wide.layers, x, y, ce, po);
  const int64_t projections = 32 * 32 * 2 + 2 * 32 * 16 + 3 * 32 * 48;  // q, o; k, v (2 kv heads of 8); gate, up, down
  for (int layer : {1, 2}) {
    SCOPED_TRACE(pl.layers[layer].name);
    EXPECT_EQ(pw.layers[layer].param_bytes - pl.layers[layer].param_bytes, 2 * projections);
    EXPECT_EQ(pl.layers[layer].trained_bytes(), pw.layers[layer].trained_bytes());
    EXPECT_LT(pl.layers[layer].saved_bytes, pw.layers[layer].saved_bytes)
        << "with float32 weights each micro-batch keeps its own bfloat16 casts";
    std::printf("frozen_dtype %s: parameter bytes %lld (float32 frozen) -> %lld (bf16), saved per micro-batch %lld -> %lld\n",
                pl.layers[layer].name.c_str(), static_cast<long long>(pw.layers[layer].param_bytes),
                static_cast<long long>(pl.layers[layer].param_bytes), static_cast<long long>(pw.layers[layer].saved_bytes),
                static_cast<long long>(pl.layers[layer].saved_bytes));
  }
  EXPECT_EQ(pw.layers[4].param_bytes - pl.layers[4].param_bytes, 2 * 32 * 32);  // the head
}

TEST(FrozenDtype, BadSettingsAreOneLineErrors) {
  EXPECT_NE(build_error({{"frozen_dtype", "bf16"}}, "fp32").find("model.frozen_dtype: \"bf16\" needs train.precision \"bf16\""),
            std::string::npos)
      << build_error({{"frozen_dtype", "bf16"}}, "fp32");
  EXPECT_NE(build_error({{"frozen_dtype", "bf16"}, {"freeze", {"e.*"}}}).find("no Linear weight is frozen"), std::string::npos)
      << build_error({{"frozen_dtype", "bf16"}, {"freeze", {"e.*"}}});
  EXPECT_NE(build_error({{"frozen_dtype", "int8"}}).find("frozen_dtype"), std::string::npos) << build_error({{"frozen_dtype", "int8"}});
  EXPECT_EQ(build_error({{"frozen_dtype", "fp32"}}, "fp32"), "(built)");
}

// A what-if in another precision (plan --compare and --auto, bench --precision) takes the frozen
// weights along: float32 under fp32.
TEST(FrozenDtype, AWhatIfInAnotherPrecisionTakesTheFrozenWeightsAlong) {
  const job::Config c = job::parse_config(config({{"frozen_dtype", "bf16"}}), "frozen.json");
  const job::Config fp32 = job::with_precision(c, Precision::FP32);
  EXPECT_EQ(fp32.train.precision, Precision::FP32);
  EXPECT_EQ(fp32.model["frozen_dtype"], "fp32");
  for (const at::Tensor& p : job::build_model(fp32).layers->parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat);
  EXPECT_EQ(job::with_precision(c, Precision::BF16).model["frozen_dtype"], "bf16");
  EXPECT_EQ(job::precision_overrides(c, "fp32"), (std::vector<std::string>{"train.precision=fp32", "model.frozen_dtype=fp32"}));
  const job::Config plain = job::parse_config(config(nlohmann::json::object()), "plain.json");
  EXPECT_FALSE(job::with_precision(plain, Precision::FP32).model.contains("frozen_dtype"));
  EXPECT_EQ(job::precision_overrides(plain, "bf16"), std::vector<std::string>{"train.precision=bf16"});
}

// `pipetrain train`: 4 steps at once, 2 + 2 through a checkpoint and as 2 processes end with the same loss; the
// checkpoint keeps the frozen weights in bfloat16; `plan --compare` and `plan --auto` plan the
// other precision with the frozen weights following it; `generate` continues a prompt from it.
TEST(FrozenDtype, TrainsResumesAndGeneratesFromTheCommandLine) {
  const std::string work = work_dir() + "/cli";
  std::filesystem::remove_all(work);
  std::filesystem::create_directories(work);
  std::ofstream(work + "/frozen.json") << config({{"frozen_dtype", "bf16"}}).dump(2);
  const std::string bin = PIPETRAIN_BINARY, cfg = work + "/frozen.json";
  auto run = [&](const std::string& args) {
    const auto r = test::shell(bin + " " + args + " 2>&1");
    EXPECT_EQ(r.status, 0) << args << "\n" << r.out;
    return r.out;
  };
  auto last_loss = [](const std::string& metrics) {
    std::ifstream in(metrics);
    std::string line, last;
    while (std::getline(in, line))
      if (line.find("\"loss\"") != std::string::npos) last = line;
    return nlohmann::json::parse(last).at("loss").get<double>();
  };
  run("train " + cfg + " --quiet --checkpoint-dir " + work + "/a --metrics " + work + "/a.jsonl");
  run("train " + cfg + " --quiet --checkpoint-dir " + work + "/b --until-step 2");
  run("train " + cfg + " --quiet --checkpoint-dir " + work + "/b --resume --metrics " + work + "/b.jsonl");
  EXPECT_EQ(last_loss(work + "/a.jsonl"), last_loss(work + "/b.jsonl"));
  run("launch --nproc 2 -- train " + cfg + " --quiet --checkpoint-dir " + work + "/c --metrics " + work +
      "/c.jsonl --set runtime.kind=processes --set runtime.transport=gloo");
  EXPECT_EQ(last_loss(work + "/a.jsonl"), last_loss(work + "/c.jsonl")) << "2 processes over Gloo";
  run("export " + work + "/a " + work + "/a.pt");
  run("export " + work + "/b " + work + "/b.pt");
  auto tensors = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::map<std::string, at::Tensor> out;
    for (auto& [name, t] : checkpoint::load_tensor_dict(bytes, path)) out[name] = t;
    return out;
  };
  const auto a = tensors(work + "/a.pt"), b = tensors(work + "/b.pt");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    EXPECT_TRUE(torch::equal(t, b.at(name))) << name << " resumed";
    EXPECT_EQ(t.scalar_type(), is_frozen_projection(name) ? at::kBFloat16 : at::kFloat) << name;
  }
  const std::string compared = run("plan " + cfg + " --compare");
  EXPECT_EQ(compared.find("frozen_dtype"), std::string::npos) << "the fp32 row plans float32 frozen weights\n" << compared;
  // With float32 frozen weights under bf16 the plan says what frozen_dtype would save.
  const std::string hint = run("plan " + cfg + " --set model.frozen_dtype=fp32");
  EXPECT_NE(hint.find("frozen weights: 64.0 KiB of frozen Linear weights in float32 under bf16; model.frozen_dtype \"bf16\" keeps them"),
            std::string::npos)
      << hint;
  // The auto-planner's pick is a config that loads: its frozen_dtype follows its precision.
  run("plan " + cfg + " --auto --top 1 --write-config " + work + "/chosen.json");
  const nlohmann::json chosen = nlohmann::json::parse(std::ifstream(work + "/chosen.json"));
  EXPECT_EQ(chosen["model"]["frozen_dtype"], chosen["train"]["precision"]) << chosen.dump();
  run("train " + work + "/chosen.json --quiet --set train.steps=1 --set train.checkpoint_every=0");
  const std::string out = run("generate " + cfg + " --checkpoint " + work + "/a --prompt-ids \"1 2 3\" --tokens 4");
  EXPECT_NE(out.find("1 2 3 "), std::string::npos) << out;
}
