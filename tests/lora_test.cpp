// LoRA's adapters (models/lora.h, models/hf_lora.h): the llama_block's adapters as layers, and the
// hf family's LoRA fine-tuning against PEFT itself (tests/hf_lora.py makes a tiny Llama and a PEFT
// adapter of every projection with random A and B, PEFT's logits, its 5 SGD steps of the adapters
// alone, the trained adapter and the trained model merged): the logits equal PEFT's, the steps on
// 3 stages its losses and trained adapters, every frozen weight unchanged; `export --format peft`
// writes an adapter PEFT loads to the same logits; the merged weights equal merge_and_unload's.
// In float64 a LoRA step of every schedule, recomputation and copy count (a sharded AdamW with
// weight decay, keyed adapter dropout) equals one device's to 1e-10, the frozen weights untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/error.h"
#include "common/strings.h"
#include "job/npy.h"
#include "job/single_device.h"
#include "models/decoder.h"
#include "models/hf_lora.h"
#include "models/families.h"
#include "models/safetensors.h"
#include "partitioner/cost.h"
#include "partitioner/cost_file.h"
#include "pipeline/pipeline.h"
#include "schedule/kinds.h"
#include "tests/hf_oracle.h"

using namespace pipetrain;

namespace {

nlohmann::json block(const nlohmann::json& extra = nlohmann::json::object()) {
  nlohmann::json b{{"name", "layer_0"}, {"type", "llama_block"}, {"d_model", 16}, {"n_heads", 4}, {"n_kv_heads", 2}, {"d_ff", 24}};
  b.update(extra);
  return b;
}

models::Model list_of(const nlohmann::json& layers) {
  const nlohmann::json j{{"input_shape", {6, 16}}, {"layers", layers}};
  JsonReader r(j, "model", "test");
  return models::build_layer_list(r);
}

std::string list_error(const nlohmann::json& extra) {
  try {
    list_of(nlohmann::json::array({block(extra)}));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(built)";
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>(); }

}  // namespace

// With B at zero the adapted block computes the block; its adapters are named as PEFT names them,
// counted as made, and with B not zero they add scaling · B A x to each projection.
TEST(Lora, AdaptersStartAsTheModelAndAddScaledLowRankProducts) {
  torch::manual_seed(3);
  models::Model plain = list_of(nlohmann::json::array({block()}));
  models::Model adapted = list_of(nlohmann::json::array({block({{"lora_rank", 2}, {"lora_alpha", 3}, {"lora_targets", "all"}})}));
  auto named = adapted.layers->named_parameters();
  torch::NoGradGuard no_grad;
  for (const auto& p : plain.layers->named_parameters()) named[p.key()].copy_(p.value());
  const at::Tensor x = torch::randn({3, 6, 16});
  plain.layers->eval();
  adapted.layers->eval();
  EXPECT_TRUE(torch::equal(plain.layers->forward(x), adapted.layers->forward(x)));
  int adapters = 0;
  double values = 0;
  for (const auto& p : adapted.layers->named_parameters()) {
    adapters += models::is_adapter(p.key());
    values += double(p.value().numel());
  }
  EXPECT_EQ(adapters, 14);  // A and B of q, k, v, o, gate, up and down
  ASSERT_NE(named.find("layer_0.llama.self_attn.q_proj.lora_A.weight"), nullptr);
  EXPECT_EQ(named["layer_0.llama.mlp.down_proj.lora_B.weight"].sizes(), (std::vector<int64_t>{16, 2}));
  nlohmann::json o = block({{"lora_rank", 2}, {"lora_alpha", 3}, {"lora_targets", "all"}});
  JsonReader r(o, "block", "test");
  EXPECT_EQ(models::parameter_values(models::read_llama_block(r)), values);
  // B not zero: each adapted projection gains 1.5 · B A x; the block's output differs, and merging
  // the adapters into the weights gives the same block back (float64).
  adapted.layers->to(at::kDouble);
  plain.layers->to(at::kDouble);
  std::map<std::string, at::Tensor> weights;
  for (const auto& p : adapted.layers->named_parameters()) {
    if (p.key().find("lora_B") != std::string::npos) p.value().normal_();
    weights[p.key()] = p.value().clone();
  }
  models::merge_adapters(weights, {{"lora", {{"rank", 2}, {"alpha", 3}, {"targets", "all"}}}});
  for (const auto& p : plain.layers->named_parameters()) p.value().copy_(weights.at(p.key()));
  const at::Tensor xd = x.to(at::kDouble);
  EXPECT_GT(max_diff(adapted.layers->forward(xd), plain.layers->forward(xd) * 0), 0);
  EXPECT_LE(max_diff(adapted.layers->forward(xd), plain.layers->forward(xd)), 1e-12);
}

// A copy (the data-parallel copies of one process clone the model) keeps the adapters; which
// parameters are frozen, torch's clone forgets and the copies restore (pipeline/copies.cpp: the
// grid below, 2 copies in one process).
TEST(Lora, ACloneKeepsTheAdaptersAndWhatIsFrozen) {
  models::Model m = list_of(nlohmann::json::array({block({{"lora_rank", 2}, {"lora_targets", nlohmann::json{"q_proj", "up_proj"}}})}));
  models::freeze_all_but_adapters(*m.layers);
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : m.layers->named_parameters())
      if (p.key().find("lora_B") != std::string::npos) p.value().normal_();
  }
  auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(m.layers->clone());
  ASSERT_TRUE(copy);
  // torch's clone of a Sequential names its layers by their index: the same parameters in order.
  const auto a = m.layers->named_parameters(), b = copy->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string& name = a[i].key();
    EXPECT_EQ(name.substr(name.find('.')), b[i].key().substr(b[i].key().find('.')));
    EXPECT_TRUE(torch::equal(a[i].value(), b[i].value())) << name;
  }
  m.layers->eval();
  copy->eval();
  const at::Tensor x = torch::randn({2, 6, 16});
  EXPECT_TRUE(torch::equal(m.layers->forward(x), copy->forward(x)));
}

TEST(Lora, BadArgumentsAreOneLineErrors) {
  EXPECT_NE(list_error({{"lora_alpha", 4}}).find("lora_alpha: needs lora_rank above 0"), std::string::npos) << list_error({{"lora_alpha", 4}});
  EXPECT_NE(list_error({{"lora_rank", 2}, {"lora_targets", nlohmann::json{"c_attn"}}}).find("lora_targets: names \"c_attn\", not one of q_proj"),
            std::string::npos);
  EXPECT_NE(list_error({{"lora_rank", 2}, {"lora_targets", nlohmann::json{"q_proj", "q_proj"}}}).find("names q_proj twice"), std::string::npos);
  EXPECT_NE(list_error({{"lora_rank", 2}, {"lora_targets", nlohmann::json::array()}}).find("must be \"all\" or a list"), std::string::npos);
  EXPECT_NE(list_error({{"lora_rank", 2}, {"experts", 4}, {"lora_targets", nlohmann::json{"up_proj"}}}).find("names up_proj, which the block"),
            std::string::npos);
  EXPECT_NE(list_error({{"lora_rank", 2}, {"mlp_gate", false}, {"lora_targets", nlohmann::json{"gate_proj"}}}).find("names gate_proj"),
            std::string::npos);
  EXPECT_EQ(list_error({{"lora_rank", 2}, {"experts", 4}, {"lora_targets", "all"}}), "(built)");  // attention's alone
  EXPECT_EQ(list_error({{"lora_rank", 2}, {"lora_targets", "all-linear"}}), "(built)");       // PEFT's spelling
  EXPECT_NE(list_error({{"lora_rank", 2}, {"mixer", false}, {"experts", 4}, {"lora_targets", "all"}}).find("\"all\" finds no projection"),
            std::string::npos);
}

namespace {

std::string lora_root() { return test::scratch_dir("lora"); }

bool has_peft() {
  return test::shell(test::python() + " -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec(\"peft\") is None)' >/dev/null 2>&1").status == 0;
}
std::string oracle() { return std::string(PIPETRAIN_SOURCE_DIR) + "/tests/hf_lora.py"; }

at::Tensor load_npy(const std::string& file) {
  const job::NpyHeader h = job::read_npy_header(file);
  const at::ScalarType type = h.descr == "'<i8'" ? at::kLong : h.descr == "'<f8'" ? at::kDouble : at::kFloat;
  return job::map_file(file, h.offset, h.shape, type).clone();
}

at::Tensor ce(const at::Tensor& out, const at::Tensor& target) {
  return torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}), target.reshape({-1}));
}

// The cases once per run of this binary.
const std::string& made() {
  static const std::string root = [] {
    const auto r = test::shell(test::python() + " " + oracle() + " make " + lora_root() + " 2>&1");
    if (r.status != 0) throw Error("tests/hf_lora.py make failed: " + r.out);
    return lora_root();
  }();
  return root;
}

models::Model adapted(const std::string& dir, int64_t T, const nlohmann::json& lora = nlohmann::json::object()) {
  nlohmann::json section{{"path", dir + "/adapter"}};
  section.update(lora);
  return test::hf_build(dir + "/model", T, {{"lora", section}});
}

}  // namespace

TEST(HfLora, EqualsPeftLogitsStepsAdaptersAndMergedWeights) {
  if (!has_peft()) GTEST_SKIP() << "the project's Python has no peft (scripts/setup.sh installs it)";
  for (const std::string dtype : {"float64", "float32"}) {
    const std::string dir = made() + "/" + dtype;
    const double tol = dtype == "float64" ? 1e-10 : 1e-5;
    const at::Tensor tokens = load_npy(dir + "/tokens.npy");
    const int64_t T = tokens.size(1) - 1;
    const at::Tensor x = tokens.narrow(1, 0, T).contiguous(), y = tokens.narrow(1, 1, T).contiguous();
    models::Model m = adapted(dir, T);
    std::map<std::string, at::Tensor> before;
    for (const auto& p : m.layers->named_parameters()) before[p.key()] = p.value().clone();
    pipeline::PipelineOptions o;
    o.stages = 3;
    o.micro_batches = 2;
    pipeline::Pipeline pipe(m.layers, o, ce);
    const double logits = max_diff(pipe.predict(x), load_npy(dir + "/logits.npy"));
    pipe.optimizers().set([](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 0.5); });
    const at::Tensor losses = load_npy(dir + "/losses.npy");
    double loss = 0;
    for (int64_t s = 0; s < losses.size(0); ++s) loss = std::max(loss, std::abs(pipe.train_step(x, y) - losses[s].item<double>()));
    // The trained adapters against PEFT's (its names, through export's mapping); the frozen unchanged.
    std::map<std::string, at::Tensor> weights;
    for (const auto& p : m.layers->named_parameters()) {
      weights[p.key()] = p.value().detach();
      if (!models::is_adapter(p.key())) EXPECT_TRUE(torch::equal(p.value(), before.at(p.key()))) << p.key() << " is frozen";
      else EXPECT_FALSE(torch::equal(p.value(), before.at(p.key()))) << p.key() << " trains";
    }
    nlohmann::json model{{"family", "hf"}, {"path", dir + "/model"}, {"lora", {{"path", dir + "/adapter"}}}};
    EXPECT_EQ(models::save_peft(dir + "/model", weights, model, dir + "/ours"), 42u);  // 3 layers x 7 projections x A, B
    const models::SafetensorsFile ours(dir + "/ours/adapter_model.safetensors"), trained(dir + "/trained/adapter_model.safetensors");
    double adapters = 0;
    ASSERT_EQ(ours.names().size(), trained.names().size());
    for (const std::string& n : trained.names()) {
      ASSERT_TRUE(ours.contains(n)) << n;
      adapters = std::max(adapters, max_diff(ours.get(n), trained.get(n)));
    }
    // Merged into the weights as merge_and_unload merges them.
    models::merge_adapters(weights, model);
    const models::SafetensorsCheckpoint merged(dir + "/merged");
    const models::HfSpec spec = models::read_hf_spec(dir + "/model", T, "test");
    double merge = 0;
    for (const models::HfTensor& t : spec.tensors) merge = std::max(merge, max_diff(weights.at(t.ours), merged.get(t.theirs)));
    // PEFT loads our adapter over the model: its logits are the trained model's.
    const auto checked = test::shell(test::python() + " " + oracle() + " check " + dir + " " + dir + "/ours 2>/dev/null");
    ASSERT_EQ(checked.status, 0) << checked.out;
    const nlohmann::json peft = nlohmann::json::parse(checked.out.substr(checked.out.find('{')));
    std::printf("lora %s logits=%.3g sgd5-loss=%.3g adapters=%.3g merged=%.3g peft-loads-ours: adapters=%.3g logits=%.3g\n", dtype.c_str(),
                logits, loss, adapters, merge, peft["adapters"].get<double>(), peft["logits"].get<double>());
    EXPECT_LE(logits, tol) << dtype;
    EXPECT_LE(loss, tol) << dtype;
    EXPECT_LE(adapters, tol) << dtype;
    EXPECT_LE(merge, tol) << dtype;
    EXPECT_TRUE(peft["names"].get<bool>()) << checked.out;
    EXPECT_LE(peft["adapters"].get<double>(), tol) << dtype;
    EXPECT_LE(peft["logits"].get<double>(), tol) << dtype;
  }
}

namespace {

// Every schedule of `kinds` (its default chunks), recomputation mode of `modes`, 2 and 3 stages, 1
// and 2 copies (2: a sharded AdamW): 2 steps with keyed adapter dropout equal one device's steps
// to 1e-10 in float64, and the frozen weights (AdamW's weight decay included) stay as they were.
// Returns the cases run.
int pipeline_equals_one_device(const std::string& dir, const std::vector<schedule::Kind>& kinds, const std::vector<Recompute>& modes) {
  const at::Tensor tokens = load_npy(dir + "/tokens.npy");
  const int64_t T = tokens.size(1) - 1;
  // 8 samples (the 4 twice): 4 micro-batches of each of 2 copies' 4.
  const at::Tensor x = tokens.narrow(1, 0, T).repeat({2, 1}).contiguous(), y = tokens.narrow(1, 1, T).repeat({2, 1}).contiguous();
  const nlohmann::json lora{{"dropout", 0.25}};
  auto adamw = [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  };
  models::Model one = adapted(dir, T, lora);
  job::SingleDevice single(one.layers, ce, adamw, 11, Precision::FP32, one.ties);
  std::map<std::string, at::Tensor> before;
  for (const auto& p : one.layers->named_parameters()) before[p.key()] = p.value().clone();
  std::vector<double> want;
  for (int s = 0; s < 2; ++s) want.push_back(single.train_step(x, y));
  int cases = 0;
  using schedule::Kind;
  for (const Kind kind : kinds)
    for (const int stages : {2, 3})
      for (const Recompute rc : modes)
        for (const int copies : {1, 2}) {
          // Interleaved 1F1B sends micro-batches in groups of the stage count, DualPipeV needs twice
          // the stages': 4 of them, 2 stages alone.
          if ((kind == Kind::Interleaved1F1B || kind == Kind::DualPipeV) && stages == 3) continue;
          pipeline::PipelineOptions o;
          o.schedule = kind;
          o.stages = stages;
          o.chunks = schedule::info(kind).default_chunks;
          o.micro_batches = 4;
          o.recompute = rc;
          o.seed = 11;
          o.data_parallel = copies;
          o.shard_optimizer = copies > 1;
          models::Model m = adapted(dir, T, lora);
          o.ties = m.ties;
          pipeline::Pipeline pipe(m.layers, o, ce);
          pipe.optimizers().set(adamw);
          const std::string what = pipetrain::detail::concat(schedule::name(kind), " stages=", stages, " ", recompute_name(rc), " copies=", copies);
          for (int s = 0; s < 2; ++s) EXPECT_NEAR(pipe.train_step(x, y), want[s], 1e-10) << what;
          const auto got = m.layers->named_parameters();
          for (const auto& p : one.layers->named_parameters()) {
            EXPECT_LE(max_diff(got[p.key()], p.value()), 1e-10) << what << " " << p.key();
            if (!models::is_adapter(p.key())) EXPECT_TRUE(torch::equal(got[p.key()], before.at(p.key()))) << what << " " << p.key();
          }
          ++cases;
        }
  return cases;
}

}  // namespace

TEST(HfLora, PipelineStepsEqualOneDeviceWithFrozenWeights) {
  if (!has_peft()) GTEST_SKIP() << "the project's Python has no peft (scripts/setup.sh installs it)";
  using schedule::Kind;
  const int cases = pipeline_equals_one_device(made() + "/float64", {Kind::GPipe, Kind::OneFOneB, Kind::Interleaved1F1B, Kind::ZbH1, Kind::ZbV, Kind::DualPipeV},
                                               {Recompute::Always, Recompute::ExceptLast, Recompute::Never});
  EXPECT_EQ(cases, 60);
  std::printf("lora pipeline cases=%d\n", cases);
}

// A tied model (Llama's head the embedding, both frozen): the frozen tie is left out of the
// gradient sums, the adapters of three projections train as on one device.
TEST(HfLora, AFrozenTieStaysOutOfTheSums) {
  if (!has_peft()) GTEST_SKIP() << "the project's Python has no peft (scripts/setup.sh installs it)";
  const std::string dir = made() + "/tied";
  ASSERT_EQ(adapted(dir, 8).ties.size(), 1u);
  using schedule::Kind;
  EXPECT_EQ(pipeline_equals_one_device(dir, {Kind::OneFOneB, Kind::ZbV}, {Recompute::ExceptLast}), 8);
}

// The model section's "lora" and a PEFT adapter's config: one-line errors naming what and where.
TEST(HfLora, BadSectionsAndAdaptersAreOneLineErrors) {
  if (!has_peft()) GTEST_SKIP() << "the project's Python has no peft (scripts/setup.sh installs it)";
  const std::string dir = made() + "/float32";
  auto error = [&](const nlohmann::json& lora) {
    return test::hf_error(dir + "/model", 8, {{"lora", lora}});
  };
  EXPECT_NE(error({{"alpha", 4}}).find("model.lora.rank"), std::string::npos) << error({{"alpha", 4}});
  EXPECT_NE(error({{"rank", 4}, {"targets", {"qkv"}}}).find("names \"qkv\""), std::string::npos);
  EXPECT_NE(error({{"path", dir + "/adapter"}, {"rank", 4}}).find("is the adapter's"), std::string::npos);
  EXPECT_NE(error({{"path", dir}}).find("has no adapter_config.json"), std::string::npos);
  EXPECT_NE(error({{"rank", 4}, {"bogus", 1}}).find("bogus"), std::string::npos);
  // An adapter with DoRA, or a tensor that is no adapter of the model.
  const std::string bad = lora_root() + "/bad";
  std::filesystem::create_directories(bad);
  std::filesystem::copy_file(dir + "/adapter/adapter_model.safetensors", bad + "/adapter_model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir + "/adapter/adapter_config.json"));
  config["use_dora"] = true;
  std::ofstream(bad + "/adapter_config.json") << config.dump();
  EXPECT_NE(error({{"path", bad}}).find("use_dora true is not supported"), std::string::npos) << error({{"path", bad}});
  config["use_dora"] = false;
  config["target_modules"] = {"q_proj"};
  std::ofstream(bad + "/adapter_config.json") << config.dump();
  EXPECT_NE(error({{"path", bad}}).find("is no adapter of this model's projections"), std::string::npos) << error({{"path", bad}});
}

// The command line end to end: `pipetrain train` with "lora" on token data, 4 steps at once, 2 + 2
// through a checkpoint (--until-step, --resume) and as 2 processes over Gloo (`launch`) give the
// same adapters bit for bit; `export
// --format peft` writes them, `--format hf` the merged model, whose frozen tensors (the embedding,
// the norms, the head) are the source's.
TEST(HfLora, TrainsResumesExactlyAndExportsFromTheCommandLine) {
  if (!has_peft()) GTEST_SKIP() << "the project's Python has no peft (scripts/setup.sh installs it)";
  const std::string dir = made() + "/float32", work = lora_root() + "/cli";
  std::filesystem::remove_all(work);
  std::filesystem::create_directories(work);
  {
    std::vector<uint16_t> ids(4000);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>((i * 7 + i / 13) % 64);
    std::ofstream(work + "/tokens.bin", std::ios::binary).write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 2));
  }
  const nlohmann::json config{
      {"model", {{"family", "hf"}, {"path", dir + "/model"}, {"seq_len", 8}, {"lora", {{"rank", 4}, {"alpha", 8}, {"dropout", 0.1}, {"targets", "all"}}}}},
      {"data", {{"kind", "tokens"}, {"path", work + "/tokens.bin"}, {"dtype", "uint16"}, {"batch_size", 4}, {"stride", 8}}},
      {"pipeline", {{"stages", 2}, {"micro_batches", 2}, {"schedule", "1f1b"}}},
      {"optimizer", {{"kind", "adamw"}, {"lr", 0.01}, {"weight_decay", 0.1}}},
      {"train", {{"steps", 4}, {"checkpoint_every", 2}, {"seed", 3}}}};
  std::ofstream(work + "/lora.json") << config.dump(2);
  const std::string bin = PIPETRAIN_BINARY, cfg = work + "/lora.json";
  auto run = [&](const std::string& args) {
    const auto r = test::shell(bin + " " + args + " 2>&1");
    EXPECT_EQ(r.status, 0) << args << "\n" << r.out;
    return r.out;
  };
  run("train " + cfg + " --quiet --checkpoint-dir " + work + "/a");
  run("train " + cfg + " --quiet --checkpoint-dir " + work + "/b --until-step 2");
  run("train " + cfg + " --quiet --checkpoint-dir " + work + "/b --resume");
  run("launch --nproc 2 -- train " + cfg + " --quiet --checkpoint-dir " + work + "/c --set runtime.kind=processes --set runtime.transport=gloo");
  for (const char* side : {"a", "b", "c"}) {
    run("export " + work + "/" + side + " " + work + "/" + side + "-peft --format peft");
    run("export " + work + "/" + side + " " + work + "/" + side + "-hf --format hf");
  }
  const models::SafetensorsFile a(work + "/a-peft/adapter_model.safetensors"), b(work + "/b-peft/adapter_model.safetensors"),
      c(work + "/c-peft/adapter_model.safetensors");
  ASSERT_EQ(a.names().size(), 42u);
  for (const std::string& n : a.names()) {
    EXPECT_TRUE(torch::equal(a.get(n), b.get(n))) << n << " resumed";
    EXPECT_TRUE(torch::equal(a.get(n), c.get(n))) << n << " as 2 processes";
  }
  const nlohmann::json adapter = nlohmann::json::parse(std::ifstream(work + "/a-peft/adapter_config.json"));
  EXPECT_EQ(adapter["r"], 4);
  EXPECT_EQ(adapter["lora_alpha"], 8.0);
  EXPECT_EQ(adapter["target_modules"].size(), 7u);
  const models::SafetensorsCheckpoint merged(work + "/a-hf"), again(work + "/b-hf"), source(dir + "/model");
  for (const std::string& n : source.names()) {
    EXPECT_TRUE(torch::equal(merged.get(n), again.get(n))) << n;
    const bool adapted = n.find("_proj.") != std::string::npos;
    EXPECT_EQ(torch::equal(merged.get(n), source.get(n)), !adapted) << n << (adapted ? " has its adapter merged" : " is frozen");
  }
  // model.frozen_dtype bf16: the merged projections (and the frozen head) in bfloat16, the rest
  // as the source holds it, the config's dtype the widest (float32).
  run("train " + cfg + " --quiet --checkpoint-dir " + work + "/d --set train.precision=bf16 --set model.frozen_dtype=bf16");
  run("export " + work + "/d " + work + "/d-hf --format hf");
  const models::SafetensorsCheckpoint low(work + "/d-hf");
  for (const std::string& n : source.names()) {
    const bool linear = n.find("_proj.") != std::string::npos || n == "lm_head.weight";
    EXPECT_EQ(low.get(n).scalar_type(), linear ? at::kBFloat16 : at::kFloat) << n;
    if (!linear) EXPECT_TRUE(torch::equal(low.get(n), source.get(n))) << n;
  }
  const nlohmann::json written = nlohmann::json::parse(std::ifstream(work + "/d-hf/config.json"));
  EXPECT_EQ(written.value("dtype", written.value("torch_dtype", "")), "float32");
}

// The plan's memory: a layer's gradients and optimizer state follow its trainable bytes alone (a
// profile of a LoRA model, or a cost file's trainable_bytes), its parameters are held whole; the
// cost file reads and writes the field (absent: every parameter trains) and refuses more trainable
// bytes than parameter bytes.
TEST(LoraPlan, StateFollowsTheTrainableBytes) {
  partitioner::MemoryModel mm;
  mm.state_factor = 3;
  mm.recompute = Recompute::Never;
  partitioner::LayerCost all, frozen;
  all.param_bytes = frozen.param_bytes = 1000;
  all.saved_bytes = frozen.saved_bytes = 10;
  frozen.trainable_bytes = 100;
  EXPECT_EQ(partitioner::stage_memory({all}, 0, 1, 0, mm), 1000 + 3000 + 10);
  EXPECT_EQ(partitioner::stage_memory({frozen}, 0, 1, 0, mm), 1000 + 300 + 10);
  EXPECT_EQ(partitioner::stage_memory({frozen, all}, 0, 2, 0, mm), 2000 + 3300 + 20);
  const partitioner::CostFile f = partitioner::parse_cost_file(
      R"({"layers": [{"name": "a", "forward_ms": 1, "backward_ms": 2, "param_bytes": 1000, "activation_bytes": 8, "trainable_bytes": 100},
                     {"name": "b", "forward_ms": 1, "backward_ms": 2, "param_bytes": 1000, "activation_bytes": 8}]})",
      "costs.json");
  EXPECT_EQ(f.layers[0].trained_bytes(), 100);
  EXPECT_EQ(f.layers[1].trained_bytes(), 1000);
  std::ostringstream out;
  partitioner::write_cost_file(out, f);
  const partitioner::CostFile back = partitioner::parse_cost_file(out.str(), "again.json");
  EXPECT_EQ(back.layers[0].trainable_bytes, 100);
  EXPECT_EQ(back.layers[1].trainable_bytes, -1);
  try {
    partitioner::parse_cost_file(
        R"({"layers": [{"name": "a", "forward_ms": 1, "backward_ms": 2, "param_bytes": 10, "activation_bytes": 8, "trainable_bytes": 11}]})", "bad.json");
    FAIL() << "more trainable bytes than parameter bytes";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"trainable_bytes\" (11) exceeds \"param_bytes\" (10)"), std::string::npos) << e.what();
  }
  // The profiler's: a LoRA block's trainable bytes are its adapters'.
  models::Model m = list_of(nlohmann::json::array({block({{"lora_rank", 2}, {"lora_targets", nlohmann::json{"q_proj"}}})}));
  models::freeze_all_but_adapters(*m.layers);
  int64_t adapters = 0;
  for (const at::Tensor& p : models::trainable_parameters(*m.layers)) adapters += int64_t(p.nbytes());
  EXPECT_EQ(adapters, 4 * 2 * (16 + 16));
}

// A projection read from a fused tensor of the checkpoint (Phi-3's gate_up_proj) trains an adapter,
// merges into the fused tensor, and is refused by --format peft, naming the tensor.
TEST(HfLora, AFusedProjectionMergesButIsNoPeftAdapter) {
  const nlohmann::json phi3{{"architectures", {"Phi3ForCausalLM"}}, {"model_type", "phi3"}, {"vocab_size", 40}, {"hidden_size", 16},
                            {"intermediate_size", 24}, {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                            {"rms_norm_eps", 1e-6}, {"rope_theta", 10000.0}, {"hidden_act", "silu"}, {"tie_word_embeddings", false}};
  const std::string dir = test::hf_write_model(lora_root() + "/phi3", phi3);
  const nlohmann::json model{{"family", "hf"}, {"path", dir}, {"lora", {{"rank", 2}, {"targets", "all"}}}};
  models::Model m = test::hf_build(dir, 8, {{"lora", model["lora"]}});
  std::map<std::string, at::Tensor> weights;
  for (const auto& p : m.layers->named_parameters()) weights[p.key()] = p.value().detach();
  try {
    models::save_peft(dir, weights, model, lora_root() + "/phi3-peft");
    FAIL() << "a fused projection as a PEFT adapter";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("fused tensor 'model.layers.0.mlp.gate_up_proj.weight'"), std::string::npos) << e.what();
  }
  models::merge_adapters(weights, model);
  EXPECT_GT(models::save_hf(dir, weights, lora_root() + "/phi3-merged", 1 << 20), 0u);
}

namespace {

models::Model gpt(const nlohmann::json& extra) {
  nlohmann::json j{{"family", "gpt"}, {"vocab_size", 32}, {"seq_len", 8}, {"d_model", 16}, {"n_heads", 2}, {"n_layers", 3}, {"dropout", 0.1}};
  j.update(extra);
  JsonReader r(j, "model", "test");
  return models::build(r, 5);
}

std::string gpt_error(const nlohmann::json& extra) {
  try {
    gpt(extra);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(built)";
}

}  // namespace

// `model.freeze` on any family (a GPT here, with keyed dropout): what it names keeps its values and
// the rest trains as on one device, to 1e-10 in float64, for several schedules and 1 or 2 copies
// (a sharded AdamW with weight decay); a tie frozen whole stays out of the sums.
TEST(Freeze, FrozenParametersKeepTheirValuesAndTheRestTrainsAsOnOneDevice) {
  for (const nlohmann::json& extra : {nlohmann::json{{"freeze", {"embed.*", "block0.*"}}},
                                      nlohmann::json{{"tie_embeddings", true}, {"freeze", {"embed.tok.*", "head.*", "block1.qkv.*"}}}}) {
    SCOPED_TRACE(extra.dump());
    models::Model one = gpt(extra);
    one.layers->to(at::kDouble);
    std::map<std::string, at::Tensor> before;
    for (const auto& p : one.layers->named_parameters()) before[p.key()] = p.value().clone();
    const at::Tensor x = torch::randint(0, 32, {8, 8}), y = torch::randint(0, 32, {8, 8});
    auto adamw = [](std::vector<at::Tensor> p) {
      return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    };
    job::SingleDevice single(one.layers, ce, adamw, 4, Precision::FP32, one.ties);
    std::vector<double> want;
    for (int s = 0; s < 2; ++s) want.push_back(single.train_step(x, y));
    using schedule::Kind;
    for (const Kind kind : {Kind::OneFOneB, Kind::ZbH1, Kind::Interleaved1F1B})
      for (const int copies : {1, 2}) {
        models::Model m = gpt(extra);
        m.layers->to(at::kDouble);
        pipeline::PipelineOptions o;
        o.schedule = kind;
        o.stages = 2;
        o.chunks = schedule::info(kind).default_chunks;
        o.micro_batches = 4;
        o.seed = 4;
        o.data_parallel = copies;
        o.shard_optimizer = copies > 1;
        o.ties = m.ties;
        pipeline::Pipeline pipe(m.layers, o, ce);
        pipe.optimizers().set(adamw);
        const std::string what = pipetrain::detail::concat(schedule::name(kind), " copies=", copies);
        for (int s = 0; s < 2; ++s) EXPECT_NEAR(pipe.train_step(x, y), want[s], 1e-10) << what;
        const auto got = m.layers->named_parameters();
        for (const auto& p : one.layers->named_parameters()) {
          EXPECT_LE(max_diff(got[p.key()], p.value()), 1e-10) << what << " " << p.key();
          EXPECT_EQ(torch::equal(got[p.key()], before.at(p.key())), !p.value().requires_grad()) << what << " " << p.key();
        }
      }
  }
}

TEST(Freeze, BadPatternsAreOneLineErrors) {
  EXPECT_NE(gpt_error({{"freeze", {"embeds.*"}}}).find("model.freeze: 'embeds.*' matches no parameter (their names: 'embed."), std::string::npos)
      << gpt_error({{"freeze", {"embeds.*"}}});
  EXPECT_NE(gpt_error({{"freeze", "embed.*"}}).find("must be a list of parameter-name patterns"), std::string::npos);
  EXPECT_NE(gpt_error({{"freeze", {"*"}}}).find("leaves no parameter to train"), std::string::npos);
  EXPECT_NE(gpt_error({{"tie_embeddings", true}, {"freeze", {"embed.*"}}}).find("freezes one of the tied embed.tok.weight and head."),
            std::string::npos)
      << gpt_error({{"tie_embeddings", true}, {"freeze", {"embed.*"}}});
}
