// The planning and measuring subcommands as a user drives them: costs, simulate, plan (with
// --auto), partition and bench.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/cli_helpers.h"


TEST(Cli, CostsTransformerAndSimulate) {
  const std::string dir = ::testing::TempDir() + "/pipetrain_cli_sim_" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  const std::string costs = dir + "/gpt.json";
  Result r = run("costs transformer --layers 16 --hidden 1024 --seq 1024 --heads 16 --vocab 32000 --micro-batch 2 "
                 "--device-tflops 100 --efficiency 0.5 --bandwidth 25 --out " + costs);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("wrote 19 layers to " + costs), std::string::npos) << r.out;
  // One block: F = 24bsh^2 + 4bs^2h FLOP at 50 TFLOP/s.
  const double b = 2, sq = 1024, h = 1024;
  const double block_f = (24 * b * sq * h * h + 4 * b * sq * sq * h) / 50e12 * 1e3;
  std::ifstream in(costs);
  const auto file = nlohmann::json::parse(in);
  EXPECT_NEAR(file["layers"][1]["forward_ms"].get<double>(), block_f, 1e-9 * block_f);
  EXPECT_DOUBLE_EQ(file["link"]["bandwidth_gb_s"].get<double>(), 25);
  double step_1f1b = 0;
  for (const char* kind : {"1f1b", "zb-h1", "zb-h2", "looped-bfs", "zb-v", "dualpipev", "zb-auto"}) {
    r = run("simulate --costs " + costs + " --stages 4 --micro-batches 8 --json --schedule " + kind);
    ASSERT_EQ(r.status, 0) << kind << ": " << r.out;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["schedule"], kind);
    EXPECT_GT(j["step_ms"].get<double>(), 0) << kind;
    EXPECT_GT(j["bubble"].get<double>(), 0) << kind;
    EXPECT_LT(j["bubble"].get<double>(), 1) << kind;
    ASSERT_EQ(j["peak_memory_bytes"].size(), 4u) << kind;
    ASSERT_EQ(j["per_stage"].size(), 4u) << kind;
    EXPECT_GT(j["per_stage"][0]["peak_activation_bytes"].get<double>(), 0) << kind;
    if (std::string(kind) == "1f1b") {
      step_1f1b = j["step_ms"].get<double>();
    } else if (std::string(kind) != "looped-bfs") {
      EXPECT_LT(j["step_ms"].get<double>(), step_1f1b) << kind;
    }
  }
  r = run("simulate --costs " + costs + " --stages 2 --micro-batches 4 --schedule zb-v --trace " + dir + "/t.json");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* needle : {"simulate: zb-v, 2 stages x 2 chunks, 4 micro-batches", "from the cost file", "peak activations", "step "})
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
  std::ifstream trace(dir + "/t.json");
  const auto t = nlohmann::json::parse(trace);
  int counters = 0;
  for (const auto& e : t["traceEvents"]) counters += e["ph"] == "C";
  EXPECT_GT(counters, 8);
  // A cost file without B and W: the split is assumed and said.
  const std::string plain = dir + "/plain.json";
  std::ofstream(plain) << R"([{"forward_ms": 1, "backward_ms": 2, "param_bytes": 4, "activation_bytes": 8},
                              {"forward_ms": 1, "backward_ms": 2, "param_bytes": 4, "activation_bytes": 8}])";
  r = run("simulate --costs " + plain + " --stages 2 --micro-batches 4 --schedule zb-h1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("B and W are half of backward_ms each"), std::string::npos) << r.out;
  // Every recomputation mode, spelled as pipeline.recompute spells it (except_last was refused).
  for (const char* mode : {"never", "always", "except_last"}) {
    r = run(std::string("simulate --costs ") + plain + " --stages 2 --micro-batches 4 --json --recompute " + mode);
    ASSERT_EQ(r.status, 0) << mode << "\n" << r.out;
    EXPECT_GT(nlohmann::json::parse(r.out)["step_ms"].get<double>(), 0) << mode;
  }
  expect_clean_error(run("simulate --costs " + plain + " --stages 3 --micro-batches 4"), "2 layers cannot fill 3 virtual stages");
  expect_clean_error(run("simulate --costs " + plain + " --stages 2 --micro-batches 3 --schedule dualpipev"),
                     "dualpipev needs at least twice as many micro-batches as stages");
  std::ofstream(plain) << R"([{"forward_ms": 1, "backward_ms": 2, "backward_input_ms": 1, "param_bytes": 4, "activation_bytes": 8}])";
  expect_clean_error(run("simulate --costs " + plain + " --stages 1 --micro-batches 4"),
                     "entry 0 (layer 0): backward_input_ms and backward_weight_ms go together");
  std::ofstream(plain) << R"({"layers": [{"forward_ms": 1, "backward_ms": 2, "param_bytes": 4, "activation_bytes": 8}], "link": {"bandwidth_gb_s": -1}})";
  expect_clean_error(run("simulate --costs " + plain + " --stages 1 --micro-batches 4"), "link: \"bandwidth_gb_s\" must be a number");
  expect_clean_error(run("costs transformer --layers 2 --hidden 10 --seq 8 --heads 3 --vocab 5 --micro-batch 1"),
                     "--hidden (10) must be a multiple of --heads (3)");
  // A tied embedding and head: the file's tie (layer 0 and the head, V·h float32 values), whose
  // gradient crosses the link at the step and whose sum comes back: 2 × (0.01 ms + 32000·256·4
  // bytes at 25 GB/s) on 2 stages.
  const std::string tied = dir + "/tied.json", untied = dir + "/untied.json";
  const std::string small = "costs transformer --layers 4 --hidden 256 --seq 128 --heads 4 --vocab 32000 --micro-batch 1 "
                            "--bandwidth 25 --out ";
  ASSERT_EQ(run(small + untied).status, 0);
  r = run(small + tied + " --tie-embeddings");
  ASSERT_EQ(r.status, 0) << r.out;
  std::ifstream tied_in(tied);
  const auto tied_file = nlohmann::json::parse(tied_in);
  EXPECT_EQ(tied_file["ties"], nlohmann::json::parse(R"([{"layers": [0, 6], "bytes": 32768000}])"));
  auto step = [&](const std::string& f) {
    const Result s = run("simulate --costs " + f + " --stages 2 --micro-batches 4 --json");
    EXPECT_EQ(s.status, 0) << s.out;
    return nlohmann::json::parse(s.out.substr(s.out.find('{')))["step_ms"].get<double>();
  };
  EXPECT_NEAR(step(tied) - step(untied), 2 * (0.01 + 32768000 / 25e6), 1e-9);
  std::system(("rm -rf " + dir).c_str());
}

// `plan --auto` searches, lists the fastest plans and writes the winner as a config that trains
// as written; a memory limit nothing fits names the least that would; `train --auto` plans first.
TEST(Cli, AutoPlan) {
  const std::string cfg = write_config("auto.json", kSmall);
  const std::string out = ::testing::TempDir() + "/pipetrain_cli_auto_" + std::to_string(::getpid()) + ".json";
  Result r = run("plan " + cfg + " --auto --cores 2 --top 4 --write-config " + out);
  ASSERT_EQ(r.status, 0) << r.out;
  // Beside the pick, the plain loop on both cores, and what two busy cores were measured to cost.
  for (const char* needle : {"plans simulated in", "rank", "samples/s", "peak/device", "chosen: ", "wrote ",
                             "the plain loop on all 2 cores", "measured: 2 busy cores: each "})
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
  std::ifstream in(out);
  const auto chosen = nlohmann::json::parse(in);
  ASSERT_TRUE(chosen["pipeline"]["balance"].is_array()) << chosen.dump();
  ASSERT_TRUE(chosen["pipeline"]["defer_weight_grads"].is_boolean()) << chosen.dump();  // the dW column's choice
  EXPECT_NE(r.out.find(" dW "), std::string::npos) << r.out;
  r = run("train " + out + " --steps 2 --quiet");
  EXPECT_EQ(r.status, 0) << r.out;
  expect_clean_error(run("plan " + cfg + " --auto --devices 2 --memory-limit 1000"), "the smallest needs ");
  expect_clean_error(run("plan " + cfg + " --auto --cores 0"), "--cores");
  expect_clean_error(run("plan " + cfg + " --auto --devices 2 --speeds 1,2,3"), "--speeds: 3 speeds for 2 devices");
  r = run("train " + cfg + " --auto --steps 2 --quiet");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("chosen: "), std::string::npos) << r.out;
  std::remove(out.c_str());
}

// Data parallelism in plan, bench and the auto-planner: plan charges each stage's reduction on
// the measured link and counts the sharded optimizer's memory; bench times copies side by side
// with the plain loop and reports the reduction and the optimizer state; plan --auto searches
// copies and sharding and writes a winner that trains.
TEST(Cli, DataParallelInPlanBenchAndAutoPlan) {
  const std::string cfg = write_config("dp.json", kSmall);
  const std::string adam = " --set optimizer.kind=adam --set pipeline.data_parallel=2 --json --repeat 1";
  Result whole = run("plan " + cfg + adam);
  Result sharded = run("plan " + cfg + adam + " --set train.shard_optimizer=true");
  ASSERT_EQ(whole.status, 0) << whole.out;
  ASSERT_EQ(sharded.status, 0) << sharded.out;
  const auto w = nlohmann::json::parse(whole.out), z = nlohmann::json::parse(sharded.out);
  EXPECT_EQ(w["data_parallel"]["copies"], 2);
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"})
    EXPECT_GT(w["data_parallel"][op]["gb_s"].get<double>(), 0.0) << op;
  EXPECT_FALSE(w["data_parallel"]["sharded_optimizer"].get<bool>());
  EXPECT_TRUE(z["data_parallel"]["sharded_optimizer"].get<bool>());
  for (size_t s = 0; s < w["stages"].size(); ++s) {
    EXPECT_GT(w["stages"][s]["reduce_ms"].get<double>(), 0.0) << whole.out;
    // Adam: 1 + 1 + 2 = 4 bytes per parameter byte besides it, sharded 1 + 1 + 3/2 = 3.5.
    EXPECT_LT(z["stages"][s]["peak_memory_bytes"].get<int64_t>(), w["stages"][s]["peak_memory_bytes"].get<int64_t>());
  }
  Result text = run("plan " + cfg + " --repeat 1 --set pipeline.data_parallel=2");
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_NE(text.out.find("2 stages x 2 data-parallel copies"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("data parallel: 2 copies; all-reduce "), std::string::npos) << text.out;

  const std::string out = ::testing::TempDir() + "/pipetrain_cli_dp_" + std::to_string(::getpid()) + ".jsonl";
  std::remove(out.c_str());
  Result r = run("bench " + cfg + " --stages 1 --data-parallel 1,2 --warmup 0 --repeat 2 --min-time 0 --json " + out);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("[2/2] K=1 D=2 M=2"), std::string::npos) << r.out;
  std::ifstream in(out);
  std::string line;
  std::map<int, nlohmann::json> by_copies;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    by_copies[j["data_parallel"].get<int>()] = j;
  }
  ASSERT_EQ(by_copies.size(), 2u);
  EXPECT_FALSE(by_copies[1].contains("reduce_ms"));
  EXPECT_GT(by_copies[2]["reduce_ms"].get<double>(), 0.0) << by_copies[2].dump();
  EXPECT_GE(by_copies[2]["exposed_reduce_ms"].get<double>(), 0.0);
  EXPECT_GT(by_copies[2]["pipeline_samples_per_s"].get<double>(), 0.0);
  EXPECT_EQ(by_copies[2]["timed_steps"], nlohmann::json::array({2, 2, 2})) << by_copies[2].dump();
  EXPECT_EQ(by_copies[2]["min_time_s"].get<double>(), 0.0);
  r = run("bench " + cfg + " --set pipeline.stages=1 --set pipeline.data_parallel=2 --warmup 0 --repeat 2 --min-time 0");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("data parallel: the longest stage's reduction "), std::string::npos) << r.out;
  // The breakdown is the first copy's, its wait before the optimizers named for the copies too.
  EXPECT_NE(r.out.find("tile its step; copy 0's stages):"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("waiting for stages, copies"), std::string::npos) << r.out;

  const std::string chosen = ::testing::TempDir() + "/pipetrain_cli_dp_" + std::to_string(::getpid()) + ".json";
  r = run("plan " + cfg + " --auto --devices 2 --json --write-config " + chosen);
  ASSERT_EQ(r.status, 0) << r.out;
  int copies = 0, shards = 0;
  std::istringstream plans(r.out);
  while (std::getline(plans, line))
    if (line.rfind("{", 0) == 0) {
      const auto j = nlohmann::json::parse(line);
      EXPECT_LE(j["stages"].get<int>() * j["data_parallel"].get<int>(), 2) << line;
      copies += j["data_parallel"].get<int>() == 2;
      shards += j["shard_optimizer"].get<bool>();
    }
  EXPECT_GT(copies, 0) << r.out;
  EXPECT_GT(shards, 0) << r.out;
  r = run("train " + chosen + " --steps 2 --quiet");
  EXPECT_EQ(r.status, 0) << r.out;
  std::remove(out.c_str());
  std::remove(chosen.c_str());
}

// plan --auto on a cost file plans for hardware this machine lacks, without building the model:
// a 7B GPT (28 GB of float32 weights, more than this machine holds) on 8 devices of 80 GB, two
// of them at half speed with a slower link; the winner fits, names the devices' speeds, and
// the transfers and reductions are costed on the file's link. A file without micro_batch cannot
// be scaled to other micro-batch sizes: one line says so.
TEST(Cli, AutoPlanFromACostFile) {
  const std::string dir = ::testing::TempDir() + "/pipetrain_cli_autocosts_" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  const std::string costs = dir + "/gpt7b.json";
  Result r = run("costs transformer --layers 32 --hidden 4096 --seq 4096 --heads 32 --vocab 50257 --micro-batch 1 "
                 "--device-tflops 989 --efficiency 0.45 --bandwidth 50 --out " + costs);
  ASSERT_EQ(r.status, 0) << r.out;
  nlohmann::json file;
  {
    std::ifstream in(costs);
    file = nlohmann::json::parse(in);
  }
  EXPECT_EQ(file["micro_batch"], 1);
  file["devices"] = nlohmann::json::array();
  for (int d = 0; d < 8; ++d)
    file["devices"].push_back(d < 6 ? nlohmann::json{{"speed", 1.0}} : nlohmann::json{{"speed", 0.5}, {"bandwidth_gb_s", 10}});
  std::ofstream(costs) << file.dump();
  const std::string cfg = write_config("gpt7b.json", R"({
    "model": {"family": "gpt", "vocab_size": 50257, "seq_len": 4096, "d_model": 4096, "n_heads": 32, "n_layers": 32},
    "data": {"kind": "synthetic", "batch_size": 32},
    "pipeline": {"stages": 8},
    "optimizer": {"kind": "adamw"}
  })");
  const std::string chosen = dir + "/chosen.json";
  r = run("plan " + cfg + " --auto --costs " + costs + " --memory-limit 80000000000 --top 3 --write-config " + chosen);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("chosen: "), std::string::npos) << r.out;
  std::ifstream in(chosen);
  const auto c = nlohmann::json::parse(in);
  const int K = c["pipeline"]["stages"], D = c["pipeline"]["data_parallel"];
  EXPECT_LE(K * D, 8) << c.dump();
  EXPECT_GE(K, 2) << "28 GB of weights with Adam's state do not fit one 80 GB device: " << c.dump();
  ASSERT_TRUE(c["pipeline"]["speeds"].is_array()) << c.dump();
  EXPECT_EQ(c["pipeline"]["speeds"].size(), static_cast<size_t>(K));
  r = run("plan " + cfg + " --auto --costs " + costs + " --memory-limit 80000000000 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  std::istringstream plans(r.out);
  std::string line;
  int n = 0;
  while (std::getline(plans, line)) {
    const auto j = nlohmann::json::parse(line);
    for (double peak : j["peak_bytes"]) EXPECT_LE(peak, 80e9) << line;
    EXPECT_EQ(j["precision"], "fp32") << line;
    ++n;
  }
  EXPECT_GT(n, 10);
  expect_clean_error(run("plan " + cfg + " --auto --costs " + costs + " --devices 4"), "--devices: 4 devices, but ");
  file.erase("micro_batch");
  std::ofstream(costs) << file.dump();
  expect_clean_error(run("plan " + cfg + " --auto --costs " + costs), "the file gives no \"micro_batch\"");
  std::system(("rm -rf " + dir).c_str());
}

// `plan` profiles, partitions and simulates; --compare lists every schedule; --json is JSON;
// --save-costs writes a cost file that `partition` reads back.
TEST(Cli, PlanAndPartition) {
  const std::string cfg = write_config("plan.json", kSmall);
  const std::string costs = ::testing::TempDir() + "/pipetrain_cli_costs_" + std::to_string(::getpid()) + ".json";
  Result r = run("plan " + cfg + " --compare --repeat 1 --save-costs " + costs + " --set pipeline.balance=time");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* needle : {"balance time", "stage chunk layers", "predicted step", "gpipe", "1f1b", "zb-h1",
                             "interleaved-1f1b"})
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
  r = run("plan " + cfg + " --json --repeat 1");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* needle : {"\"balance\": [", "\"predicted\": {", "\"step_ms\"", "\"peak_memory_bytes\""})
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;

  r = run("partition --costs " + costs + " --stages 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.rfind("{\"balance\":[", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("\"bottleneck\":"), std::string::npos) << r.out;
  expect_clean_error(run("partition --costs " + costs + " --stages 9"), "9 stages");
  expect_clean_error(run("partition --costs " + costs + " --stages 2 --memory-limit 10"), "memory limit");
  expect_clean_error(run("partition --costs " + costs + " --stages 2 --speeds 1"), "--speeds: 1 speeds for 2 stages");
  const std::string bad = write_config("bad_costs.json", R"([{"name": "a", "forward_ms": -1, "backward_ms": 1, "param_bytes": 0, "activation_bytes": 0}])");
  expect_clean_error(run("partition --costs " + bad + " --stages 1"), "entry 0 (a): \"forward_ms\" must be a number from 0 to 8.64e+07, got number -1");
  expect_clean_error(run("partition --costs /nonexistent.json --stages 1"), "/nonexistent.json: cannot open the cost file");
}

// pipeline.defer_weight_grads "auto": `plan` says what a run would decide and why, and a run's
// first line says what it decided and why: the MLP bench config as shipped on its prediction,
// the small GPT config not (no weight large enough to defer), and `false` shows no decision.
TEST(Cli, PlanShowsTheAutoDeferralAndWhy) {
  const std::string mlp = std::string(PIPETRAIN_SOURCE_DIR) + "/configs/mlp_bench.json";
  Result r = run("plan " + mlp + " --repeat 3");
  ASSERT_EQ(r.status, 0) << r.out;
  // Which way depends on this machine's profile (Deferral.TheMlpBenchConfigIsDecidedOnItsProfile):
  // the line and the summary agree, and the reason is the prediction.
  const bool deferred = r.out.find("weight gradients: auto: deferred, predicted ") != std::string::npos;
  EXPECT_TRUE(deferred || r.out.find("weight gradients: auto: not deferred, predicted ") != std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(", deferred weight gradients, balance") != std::string::npos, deferred) << r.out;
  r = run("plan " + mlp + " --repeat 1 --json --set data.batch_size=512 --set pipeline.defer_weight_grads=false");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["deferred_weight_grads"].get<bool>());
  EXPECT_FALSE(j.contains("deferral")) << r.out;
  r = run("plan " + std::string(PIPETRAIN_SOURCE_DIR) + "/configs/gpt_small.json --repeat 1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("weight gradients: auto: not deferred, no weight of 1 MiB or more"), std::string::npos) << r.out;
  r = run("train " + mlp + " --steps 1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(r.out.find(", deferred weight gradients (auto: predicted ") != std::string::npos ||
              r.out.find(", weight gradients not deferred (auto: predicted ") != std::string::npos)
      << r.out;
}

// `bench` with lists sweeps every combination and writes one JSON object per combination with
// the fields the plots and tables need; a combination the config cannot run is reported as
// skipped with the reason, not dropped.
TEST(Cli, BenchSweepWritesJsonLines) {
  const std::string cfg = write_config("sweep.json", kSmall);
  const std::string out = ::testing::TempDir() + "/pipetrain_cli_sweep_" + std::to_string(::getpid()) + ".jsonl";
  std::remove(out.c_str());
  Result r = run("bench " + cfg + " --stages 1,2 --micro-batches 2,3 --schedule gpipe,interleaved-1f1b --recompute never "
                 "--warmup 0 --repeat 1 --min-time 0 --json " + out);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("[8/8] K=2 M=3 interleaved-1f1b never: skipped"), std::string::npos) << r.out;
  std::ifstream in(out);
  std::string line;
  int lines = 0, skipped = 0;
  while (std::getline(in, line)) {
    ++lines;
    const auto j = nlohmann::json::parse(line);
    if (j.contains("skipped")) {
      ++skipped;
      EXPECT_NE(j["skipped"].get<std::string>().find("multiple of 2"), std::string::npos) << line;
      continue;
    }
    for (const char* key : {"stages", "micro_batches", "schedule", "recompute", "baseline_samples_per_s",
                            "baseline_all_cores_samples_per_s", "pipeline_samples_per_s", "speedup", "bubble_measured",
                            "bubble_predicted", "peak_memory_bytes", "peak_tensor_bytes", "machine", "config"})
      EXPECT_TRUE(j.contains(key)) << key << " missing in " << line;
    EXPECT_GT(j["pipeline_samples_per_s"].get<double>(), 0.0);
    EXPECT_NEAR(j["speedup"].get<double>(),
                j["pipeline_samples_per_s"].get<double>() / j["baseline_samples_per_s"].get<double>(), 1e-9);
    EXPECT_EQ(j["config"]["model"]["family"], "mlp");
  }
  EXPECT_EQ(lines, 8);
  EXPECT_EQ(skipped, 1);
  r = run("bench " + cfg + " --schedule pipedream");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("pipedream"), std::string::npos) << r.out;
  // The sweep flag's former name says where it went.
  expect_clean_error(run("bench " + cfg + " --checkpoint never"), "bench --checkpoint: renamed --recompute");
}

// `bench --precision fp32,bf16` times both precisions of a combination back to back and compares
// the second with the first; fp16 is reported as skipped on the CPU, with the reason; `plan`
// names the precision it profiled in; a bf16 run trains and writes its loss scale (1).
TEST(Cli, BenchComparesPrecisionsAndPlanNamesIt) {
  const std::string cfg = write_config("precision.json", kSmall);
  const std::string out = ::testing::TempDir() + "/pipetrain_cli_precision_" + std::to_string(::getpid()) + ".jsonl";
  std::remove(out.c_str());
  Result r = run("bench " + cfg + " --precision fp32,bf16,fp16 --warmup 0 --repeat 1 --min-time 0 --json " + out);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("[2/3] K=2 M=2 gpipe except_last bf16: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("vs fp32: plain "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fp16: skipped: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fp16 is for GPU stages only"), std::string::npos) << r.out;
  std::ifstream in(out);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["precision"], "fp32");
  EXPECT_EQ(lines[1]["precision"], "bf16");
  EXPECT_GT(lines[1]["plain_speedup_vs_fp32"].get<double>(), 0.0);
  EXPECT_GT(lines[1]["pipeline_speedup_vs_fp32"].get<double>(), 0.0);
  EXPECT_TRUE(lines[2].contains("skipped"));
  r = run("plan " + cfg + " --set train.precision=bf16 --repeat 1");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("precision bf16"), std::string::npos) << r.out;
  const std::string metrics = ::testing::TempDir() + "/pipetrain_cli_bf16_" + std::to_string(::getpid()) + ".jsonl";
  r = run("train " + cfg + " --set train.precision=bf16 --set train.steps=3 --quiet --metrics " + metrics);
  EXPECT_EQ(r.status, 0) << r.out;
  std::ifstream m(metrics);
  std::string first;
  ASSERT_TRUE(std::getline(m, first));
  EXPECT_EQ(nlohmann::json::parse(first)["loss_scale"], 1.0) << first;
}

// With train.on_nonfinite=skip the run goes on, says which steps it skipped, and ends normally.
TEST(Cli, NonFiniteStepsCanBeSkipped) {
  const std::string cfg = write_config("skip.json", kSmall);
  Result r = run("train " + cfg + " --set optimizer.lr=1e6 --set train.steps=30 --set train.on_nonfinite=skip");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("; update skipped"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("updates skipped"), std::string::npos) << r.out;
}

// `plan --compare` predicts the configured schedule in fp32 and in bf16, each profiled, with
// bf16's speed against fp32 (text and JSON); a bf16 run on a CPU that lacks AVX-512 BF16 and AMX
// (told so by PIPETRAIN_CPU_FLAGS) is warned once, on one line, with the measured speed.
TEST(Cli, PlanCompareShowsBothPrecisionsAndABf16RunIsWarned) {
  const std::string cfg = write_config("compare_precisions.json", kSmall);
  Result r = run("plan " + cfg + " --compare --repeat 1");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* needle : {"precision", "speed vs fp32", "\nfp32 ", "\nbf16 "})
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
  r = run("plan " + cfg + " --compare --repeat 1 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["precisions"].size(), 2u) << r.out;
  EXPECT_EQ(j["precisions"][0]["precision"], "fp32");
  EXPECT_EQ(j["precisions"][1]["precision"], "bf16");
  EXPECT_GT(j["precisions"][1]["step_ms"].get<double>(), 0.0) << r.out;
  EXPECT_NEAR(j["precisions"][0]["step_ms"].get<double>(), j["predicted"]["step_ms"].get<double>(), 1e-9);

  const std::string train = "train " + cfg + " --set train.precision=bf16 --set train.steps=1 --quiet";
  r = shell("PIPETRAIN_CPU_FLAGS='fpu sse2 avx2' " + std::string(PIPETRAIN_BINARY) + " " + train + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string warning = "pipetrain: warning: precision bf16 on a CPU stage, but this CPU";
  const size_t at = r.out.find(warning);
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(warning, at + 1), std::string::npos) << "warned twice\n" << r.out;
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  EXPECT_NE(line.find("has neither AVX-512 BF16 nor AMX: a matrix product measured here ran "), std::string::npos) << line;
  EXPECT_NE(line.find("x the float32 speed (train.precision fp32 avoids it)"), std::string::npos) << line;
  r = shell("PIPETRAIN_CPU_FLAGS='avx2 avx512_bf16' " + std::string(PIPETRAIN_BINARY) + " " + train + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find(warning), std::string::npos) << r.out;
}
