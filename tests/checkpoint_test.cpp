// Checkpoints through the API: a save loads into any stage count with the same parameters,
// buffers and optimizer state, so training continues exactly; damaged, partial or foreign
// checkpoints are refused with the reason; the export is what Python's torch.load reads.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "checkpoint/checkpoint.h"
#include "pipeline/pipeline.h"
#include "checkpoint/shard.h"
#include "common/fault.h"
#include "train/trainer.h"
#include "tests/process_helpers.h"

using namespace pipetrain;
using namespace pipetrain::pipeline;
using namespace pipetrain::checkpoint;
using namespace pipetrain::train;
using namespace pipetrain::job;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

json make_config(const std::string& optimizer) {
  json c = json::parse(R"({
    "model": {"family": "gpt", "vocab_size": 16, "seq_len": 8, "d_model": 16, "n_heads": 2, "n_layers": 3, "dropout": 0.1},
    "data": {"kind": "synthetic", "batch_size": 8, "samples": 64, "test_samples": 16},
    "pipeline": {"stages": 2, "micro_batches": 4},
    "runtime": {"dtype": "float64"},
    "train": {"steps": 10, "seed": 5}
  })");
  c["optimizer"] = json::parse(optimizer);
  return c;
}

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::path(::testing::TempDir()) / ("pipetrain_ckpt_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p.string();
}

// A job and its pipeline, stepping through the job's own training batches.
struct Trainee {
  Job job;
  std::unique_ptr<Pipeline> pipe;
  explicit Trainee(const Config& c) : job(prepare(c)) {
    pipe = std::make_unique<Pipeline>(job.model.layers, job.options, mean_cross_entropy);
    pipe->optimizers().set(make_optimizer_factory(job.config.optimizer));
  }
  double step(int64_t s) {
    Batch b = to_model(job, job.data.train_batch(s, job.config.data.batch_size, job.config.train.seed));
    return pipe->train_step(b.input, b.target);
  }
};

std::vector<std::pair<std::string, at::Tensor>> params(Trainee& r) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : r.job.model.layers->named_parameters()) out.emplace_back(p.key(), p.value());
  return out;
}

std::string load_error(const std::string& dir, const Config& c) {
  Trainee r(c);
  try {
    load_checkpoint(dir, c, *r.pipe);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

void flip_byte(const fs::path& file, size_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char ch;
  f.read(&ch, 1);
  ch = static_cast<char>(ch ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&ch, 1);
}

}  // namespace

// Train 3 steps on 2 stages and save; load into 1, 2 and 3 stages (and another schedule) from a
// different initialisation; the next 3 steps equal those of the run that was never stopped.
TEST(Checkpoint, ContinuesExactlyOnAnyStageCount) {
  for (const char* optimizer : {R"({"kind": "adamw", "lr": 0.01, "weight_decay": 0.1})",
                                R"({"kind": "sgd", "lr": 0.05, "momentum": 0.9})"}) {
    SCOPED_TRACE(optimizer);
    const std::string dir = temp_dir("continue");
    Config c = parse_config(make_config(optimizer), "cfg.json");
    Trainee a(c);
    for (int s = 0; s < 3; ++s) a.step(s);
    const std::string saved = save_checkpoint(dir, c, *a.pipe, 3, 3, 3);
    EXPECT_EQ(saved, latest_checkpoint(dir));
    std::vector<double> expected;
    for (int s = 3; s < 6; ++s) expected.push_back(a.step(s));

    for (const char* layout : {"pipeline.stages=1", "pipeline.stages=2", "pipeline.stages=3", "pipeline.schedule=1f1b"}) {
      SCOPED_TRACE(layout);
      Config other = parse_config(make_config(optimizer), "cfg.json", {layout});
      Trainee b(other);
      {
        torch::NoGradGuard no_grad;
        for (auto& p : b.job.model.layers->parameters()) p.add_(torch::randn_like(p));
      }
      const CheckpointState st = load_checkpoint(saved, other, *b.pipe);
      EXPECT_EQ(st.step, 3);
      EXPECT_EQ(st.stages, 2);
      EXPECT_EQ(b.pipe->step(), 3);
      for (int s = 3; s < 6; ++s) EXPECT_NEAR(b.step(s), expected[s - 3], 1e-12) << "step " << s + 1;
      auto pa = params(a), pb = params(b);
      ASSERT_EQ(pa.size(), pb.size());
      for (size_t i = 0; i < pa.size(); ++i) {
        EXPECT_EQ(pa[i].first, pb[i].first);
        EXPECT_TRUE(torch::allclose(pa[i].second, pb[i].second, 1e-10, 1e-12)) << pa[i].first;
      }
    }
  }
}

// A tied weight (the gpt's head tied to its token embedding) is stored once, under the
// embedding's name, with its optimizer state; it loads into another stage count, the head taking
// the embedding's value and state, and training continues exactly; the export holds it once.
TEST(Checkpoint, ATiedWeightIsStoredOnceAndContinuesOnAnotherStageCount) {
  const std::string dir = temp_dir("tied");
  json tied = make_config(R"({"kind": "adamw", "lr": 0.01, "weight_decay": 0.1})");
  tied["model"]["tie_embeddings"] = true;
  Config c = parse_config(tied, "cfg.json", {"pipeline.stages=3"});
  Trainee a(c);
  ASSERT_EQ(a.pipe->tied_names().size(), 1u);
  for (int s = 0; s < 2; ++s) a.step(s);
  const std::string saved = save_checkpoint(dir, c, *a.pipe, 2, 2, 3);
  std::vector<double> expected;
  for (int s = 2; s < 4; ++s) expected.push_back(a.step(s));

  const std::string out = dir + "/model.pt";
  const size_t n = export_checkpoint(saved, out);
  EXPECT_EQ(n, a.job.model.layers->named_parameters().size() - 1 + a.job.model.layers->named_buffers().size());
  const std::string script = dir + "/keys.py";
  std::ofstream(script) << "import sys, torch\nprint(' '.join(torch.load(sys.argv[1], weights_only=True).keys()))\n";
  const auto keys = pipetrain::test::shell(std::string(PIPETRAIN_PYTHON) + " " + script + " " + out + " 2>&1");
  ASSERT_EQ(keys.status, 0) << keys.out;
  EXPECT_NE(keys.out.find("embed.tok.weight"), std::string::npos) << keys.out;
  EXPECT_EQ(keys.out.find("head.linear.weight"), std::string::npos) << keys.out;

  Config other = parse_config(tied, "cfg.json", {"pipeline.stages=2"});
  Trainee b(other);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : b.job.model.layers->parameters()) p.add_(torch::randn_like(p));
  }
  load_checkpoint(saved, other, *b.pipe);
  for (int s = 2; s < 4; ++s) EXPECT_NEAR(b.step(s), expected[s - 2], 1e-12) << "step " << s + 1;
  auto named = b.job.model.layers->named_parameters();
  EXPECT_TRUE(torch::equal(named["embed.tok.weight"], named["head.linear.weight"]));
}

// Without the optimizer state a resumed Adam run differs: the test above can fail.
TEST(Checkpoint, OptimizerStateIsWhatMakesItExact) {
  const std::string dir = temp_dir("optstate");
  Config c = parse_config(make_config(R"({"kind": "adam", "lr": 0.01})"), "cfg.json");
  Trainee a(c);
  for (int s = 0; s < 3; ++s) a.step(s);
  const std::string saved = save_checkpoint(dir, c, *a.pipe, 3, 3, 3);
  a.step(3);
  const double after = a.step(4);  // the loss after an update that used the state
  Trainee b(c);
  load_checkpoint(saved, c, *b.pipe);
  for (int vs = 0; vs < 2; ++vs) b.pipe->optimizers().of(vs)->state().clear();
  b.step(3);
  EXPECT_GT(std::abs(b.step(4) - after), 1e-9);
}

// The checkpoint of one SGD step, saved under temp_dir(name).
fs::path one_step_checkpoint(const std::string& name, const Config& c) {
  Trainee t(c);
  t.step(0);
  return save_checkpoint(temp_dir(name), c, *t.pipe, 1, 1, 3);
}

// A save that fails half-way (here a shard's write, as on a full disk) removes its partial
// directory: nothing of it is left to fill the disk until the next save.
TEST(Checkpoint, AFailedSaveLeavesNoPartialDirectory) {
  Config c = parse_config(make_config(R"({"kind": "sgd", "lr": 0.05})"), "cfg.json");
  Trainee t(c);
  t.step(0);
  const std::string dir = temp_dir("failed_save");
  set_fault_hook([](const FaultPoint& p) {
    if (std::string(p.where) == "checkpoint.shard") throw IoError("stage-0.pt: write failed (No space left on device)");
  });
  EXPECT_THROW(save_checkpoint(dir, c, *t.pipe, 1, 1, 3), IoError);
  set_fault_hook({});
  for (const auto& e : fs::directory_iterator(dir)) ADD_FAILURE() << "left behind: " << e.path();
  // The next save works and is the only thing there.
  EXPECT_NO_THROW(save_checkpoint(dir, c, *t.pipe, 1, 1, 3));
}

// A stop asked for while a checkpoint loads (SIGTERM during a long load) ends the run before its
// first step, writing nothing: the checkpoint just loaded stays the latest.
TEST(Checkpoint, AStopDuringTheLoadEndsTheRunBeforeItsFirstStep) {
  const std::string dir = temp_dir("stop_in_load");
  json j = make_config(R"({"kind": "sgd", "lr": 0.05})");
  j["train"]["checkpoint_dir"] = dir;
  {
    job::Job job = job::prepare(parse_config(j, "cfg.json"));
    train::TrainOptions o;
    o.until_step = 2;
    train::train(job, o);
  }
  const std::string saved = latest_checkpoint(dir);
  job::Job job = job::prepare(parse_config(j, "cfg.json"));
  train::TrainOptions o;
  o.resume = true;
  o.stop_requested = [] { return SIGTERM; };  // already asked when the load ends
  const train::TrainResult r = train::train(job, o);
  EXPECT_EQ(r.stop_request, SIGTERM);
  EXPECT_EQ(r.stopped_at, 2);
  EXPECT_TRUE(r.losses.empty());
  EXPECT_EQ(latest_checkpoint(dir), saved);
}

TEST(Checkpoint, RefusesDamagedOrForeignCheckpoints) {
  Config c = parse_config(make_config(R"({"kind": "sgd", "lr": 0.05})"), "cfg.json");
  const fs::path saved = one_step_checkpoint("refuse", c);
  const fs::path manifest = saved / "manifest.json";
  const std::string good = [&] { std::ifstream in(manifest); return std::string(std::istreambuf_iterator<char>(in), {}); }();
  auto restore = [&] { std::ofstream(manifest, std::ios::trunc) << good; };

  EXPECT_EQ(load_error(saved.string(), c), "");

  flip_byte(saved / "stage-1.pt", 200);
  EXPECT_NE(load_error(saved.string(), c).find("stage-1.pt: CRC-32 mismatch"), std::string::npos);
  flip_byte(saved / "stage-1.pt", 200);  // back
  fs::resize_file(saved / "stage-0.pt", fs::file_size(saved / "stage-0.pt") - 10);
  EXPECT_NE(load_error(saved.string(), c).find("truncated"), std::string::npos);

  const fs::path second = one_step_checkpoint("refuse2", c);
  std::ofstream(second / "manifest.json", std::ios::trunc) << "{\"format\": \"pipetrain-checkpoint\", ";
  EXPECT_NE(load_error(second.string(), c).find("manifest.json: not valid JSON"), std::string::npos);

  json m = json::parse(good);
  m["identity"]["seed"] = 99;  // edited without its hash
  std::ofstream(manifest, std::ios::trunc) << m.dump();
  EXPECT_NE(load_error(saved.string(), c).find("altered"), std::string::npos);
  m = json::parse(good);
  m["version"] = 7;
  std::ofstream(manifest, std::ios::trunc) << m.dump();
  EXPECT_NE(load_error(saved.string(), c).find("version 7"), std::string::npos);
  restore();

  Config wider = parse_config(make_config(R"({"kind": "sgd", "lr": 0.05})"), "cfg.json", {"model.d_model=32"});
  const std::string foreign = load_error(saved.string(), wider);
  EXPECT_NE(foreign.find("different run: model.d_model: 16 in the checkpoint, 32 in the config"), std::string::npos) << foreign;
  Config other_lr = parse_config(make_config(R"({"kind": "sgd", "lr": 0.07})"), "cfg.json");
  EXPECT_NE(load_error(saved.string(), other_lr).find("optimizer.lr"), std::string::npos);

  EXPECT_THROW(find_checkpoint(temp_dir("empty")), CheckpointError);
}

// A checkpoint's files are read only when they are regular files of the expected size: a shard
// or a manifest that is a link to /dev/zero (a device), a FIFO (opening one would wait for a
// writer) or a directory is refused at once, naming the file and what it is, before anything is
// read; nothing grows without bound or hangs.
TEST(Checkpoint, RefusesFilesThatAreNotRegular) {
  Config c = parse_config(make_config(R"({"kind": "sgd", "lr": 0.05})"), "cfg.json");
  const fs::path saved = one_step_checkpoint("irregular", c);
  const fs::path shard = saved / "stage-1.pt", kept = saved / "kept.pt";
  fs::rename(shard, kept);
  auto expect_refused = [&](const std::string& needle) {
    const std::string e = load_error(saved.string(), c);
    EXPECT_NE(e.find(needle), std::string::npos) << e;
  };
  fs::create_symlink("/dev/zero", shard);
  expect_refused("checkpoint shard " + shard.string() + ": not a regular file (a device)");
  fs::remove(shard);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0) << std::strerror(errno);
  expect_refused("checkpoint shard " + shard.string() + ": not a regular file (a FIFO)");
  fs::remove(shard);
  fs::create_directory(shard);
  expect_refused("checkpoint shard " + shard.string() + ": not a regular file (a directory)");
  fs::remove(shard);
  fs::rename(kept, shard);
  EXPECT_EQ(load_error(saved.string(), c), "");
  const fs::path manifest = saved / "manifest.json";
  fs::rename(manifest, saved / "manifest.kept");
  fs::create_symlink("/dev/urandom", manifest);
  expect_refused("checkpoint manifest " + manifest.string() + ": not a regular file (a device)");
}

// A save that dies before its manifest leaves only a hidden partial directory: the previous
// checkpoint stays the latest, and the next save clears the leftovers; old ones are pruned.
TEST(Checkpoint, PartialSavesAreIgnoredAndOldOnesPruned) {
  const std::string dir = temp_dir("partial");
  Config c = parse_config(make_config(R"({"kind": "sgd", "lr": 0.05})"), "cfg.json");
  Trainee a(c);
  a.step(0);
  const std::string first = save_checkpoint(dir, c, *a.pipe, 1, 1, 2);
  fs::create_directories(fs::path(dir) / ".step-00000002.partial");
  std::ofstream(fs::path(dir) / ".step-00000002.partial" / "stage-0.pt") << "half";
  fs::create_directories(fs::path(dir) / "step-00000003");  // no manifest: not complete
  EXPECT_EQ(latest_checkpoint(dir), first);
  EXPECT_EQ(find_checkpoint(dir), first);
  save_checkpoint(dir, c, *a.pipe, 4, 4, 2);
  save_checkpoint(dir, c, *a.pipe, 5, 5, 2);
  EXPECT_FALSE(fs::exists(fs::path(dir) / ".step-00000002.partial"));
  EXPECT_FALSE(fs::exists(first));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "step-00000004" / "manifest.json"));
  EXPECT_EQ(latest_checkpoint(dir), (fs::path(dir) / "step-00000005").string());
}

// The export is read by Python's torch.load (the torch the build uses; its default
// weights_only loader) as a dict of the model's
// named tensors with the model's values.
TEST(Checkpoint, ExportIsReadByTorchLoad) {
  const std::string dir = temp_dir("export");
  Config c = parse_config(make_config(R"({"kind": "adamw", "lr": 0.01})"), "cfg.json", {"pipeline.stages=3"});
  Trainee a(c);
  a.step(0);
  const std::string saved = save_checkpoint(dir, c, *a.pipe, 1, 1, 3);
  const std::string out = dir + "/model.pt";
  const size_t n = export_checkpoint(saved, out);
  ASSERT_EQ(n, a.job.model.layers->named_parameters().size() + a.job.model.layers->named_buffers().size());

  const std::string script = dir + "/read.py";
  std::ofstream(script) << "import json, sys, torch\n"
                           "d = torch.load(sys.argv[1], weights_only=True)\n"
                           "print(json.dumps([[k, list(v.shape), str(v.dtype), float(v.double().sum())] for k, v in d.items()]))\n";
  const auto r = pipetrain::test::shell(std::string(PIPETRAIN_PYTHON) + " " + script + " " + out + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  const json read = json::parse(r.out);
  ASSERT_EQ(read.size(), n);
  std::map<std::string, json> by_name;
  for (const json& e : read) by_name[e[0].get<std::string>()] = e;
  auto check = [&](const std::string& name, const at::Tensor& t) {
    ASSERT_EQ(by_name.count(name), 1u) << name;
    const json& e = by_name[name];
    EXPECT_EQ(e[1].get<std::vector<int64_t>>(), t.sizes().vec()) << name;
    const std::string dtype = t.scalar_type() == torch::kDouble  ? "torch.float64"
                              : t.scalar_type() == torch::kFloat ? "torch.float32"
                                                                 : "torch.int64";
    EXPECT_EQ(e[2], dtype) << name;
    EXPECT_DOUBLE_EQ(e[3].get<double>(), t.to(torch::kDouble).sum().item<double>()) << name;
  };
  for (const auto& item : a.job.model.layers->named_parameters()) check(item.key(), item.value());
  for (const auto& item : a.job.model.layers->named_buffers()) check(item.key(), item.value());
  EXPECT_EQ(read[0][0], a.job.model.layers->named_parameters()[0].key());  // model order

  // A shard, with optimizer and generator state, loads the same way.
  const auto shard = pipetrain::test::shell(std::string(PIPETRAIN_PYTHON) + " " + script + " " + saved +
                                            "/stage-0.pt 2>&1");
  ASSERT_EQ(shard.status, 0) << shard.out;
  EXPECT_NE(shard.out.find("rng/torch_cpu"), std::string::npos) << shard.out;
}

// Shards that once crashed the reader under the fuzzer (fuzz/regressions/shard_fuzz: an archive
// whose directory points past its end, a pickle whose memo index asks for 64 GB) and a pickle
// forged by hand: each is a CheckpointError, read without reading past the bytes or allocating
// what the forged fields claim.
TEST(Checkpoint, MalformedShardsAreRefused) {
  namespace fs = std::filesystem;
  int files = 0;
  for (const auto& e : fs::directory_iterator(std::string(PIPETRAIN_SOURCE_DIR) + "/fuzz/regressions/shard_fuzz")) {
    std::ifstream in(e.path(), std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_THROW(load_tensor_dict(bytes, e.path().string()), CheckpointError) << e.path();
    ++files;
  }
  EXPECT_GE(files, 2);
  // A good shard's pickle with a LONG_BINPUT of 2^32 - 1 patched in.
  c10::Dict<std::string, at::Tensor> d;
  d.insert("w", torch::ones({2}));
  std::vector<char> good = save_tensor_dict(d);
  ASSERT_EQ(load_tensor_dict(good, "good").size(), 1u);
  std::vector<char> forged = good;
  bool patched = false;
  for (size_t i = 0; i + 1 < forged.size() && !patched; ++i)
    if (forged[i] == 'q' && forged[i + 1] == 0) {  // BINPUT 0, the first memo entry
      forged[i + 1] = 1;  // BINPUT 1 before any entry: out of sequence
      patched = true;
    }
  ASSERT_TRUE(patched);
  try {
    load_tensor_dict(forged, "forged");
    ADD_FAILURE() << "accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("malformed pickle (a memo index out of sequence)"), std::string::npos) << e.what();
  }
}

