// Data parallelism: D copies of a K-stage pipeline, each on its own shard of every batch, equal
// one device training on the whole batch: the loss of every step and every parameter after
// several optimizer steps (float64, 1e-10), with the shards uneven, with and without the sharded
// optimizer (ZeRO-1), for split and interleaved schedules, with dropout and BatchNorm. The copies
// run as threads of one Pipeline (Gloo over loopback) and as one Pipeline per rank, the code
// path of runtime.kind processes (ranks as threads here: one world endpoint each over the local
// transport or UCX, and one Gloo group per stage).
#include <gtest/gtest.h>

#include <exception>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <thread>

#include <torch/torch.h>

#include "comm/process_group.h"
#include "comm/transport.h"
#include "common/rng.h"
#include "job/single_device.h"
#include "models/layers.h"
#include "models/model.h"
#include "pipeline/pipeline.h"
#include "schedule/schedule.h"
#include "schedule/simulate.h"
#include "tests/helpers.h"

using namespace pipetrain;
using nlohmann::json;

namespace {

json family_config(const std::string& family) {
  if (family == "mlp")
    return {{"family", "mlp"}, {"in", 12}, {"width", 16}, {"layers", 4}, {"out", 5}, {"dropout", 0.2}};
  if (family == "cnn")
    return {{"family", "cnn"}, {"image_size", 8}, {"channels", 2}, {"hidden", 8}, {"classes", 3}, {"dropout", 0.3}};
  return {{"family", "gpt"}, {"vocab_size", 11}, {"seq_len", 6}, {"d_model", 8}, {"n_heads", 2},
          {"n_layers", 3}, {"d_ff", 16}, {"dropout", 0.2}, {"tie_embeddings", family == "gpt_tied"}};
}

models::Model build(const std::string& family) {
  JsonReader r(family_config(family), "model", "test");
  models::Model m = models::build(r, /*seed=*/42);
  m.layers->to(torch::kDouble);
  return m;
}

struct Batch {
  at::Tensor input, target;
};

Batch make_batch(const models::Model& m, int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<int64_t> shape{n};
  shape.insert(shape.end(), m.sample_shape.begin(), m.sample_shape.end());
  if (m.token_input)
    return {torch::randint(0, m.classes, shape, gen, torch::kLong), torch::randint(0, m.classes, shape, gen, torch::kLong)};
  return {torch::randn(shape, gen).to(torch::kDouble), torch::randint(0, m.classes, {n}, gen, torch::kLong)};
}

pipeline::OptimizerFactory adam() {
  return [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  };
}
pipeline::OptimizerFactory sgd() {
  return [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(0.01));
  };
}

struct Case {
  std::string family, schedule;
  int stages, copies, micro_batches;
  int64_t batch;
  bool shard = false;
  bool ranks = false;  // one Pipeline per rank (the processes code path)
  std::string transport = "local";
  std::string optimizer = "adamw";
  bool scatter = false;  // sharded: a reduce-scatter (the default on Gloo is an all-reduce)
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.family << " " << c.schedule << " " << c.stages << " stages x " << c.copies << " copies, " << c.micro_batches
      << " micro-batches of a batch of " << c.batch << (c.shard ? ", sharded" : "") << (c.ranks ? ", ranks over " : ", threads over ")
      << c.transport << ", " << c.optimizer << (c.scatter ? ", reduce-scatter" : "");
}

constexpr int kSteps = 3;

// One device, the whole batch (job::SingleDevice, with the pipeline's dropout streams: seed 0,
// step s): the reference losses, the model after kSteps optimizer steps.
std::vector<double> reference(models::Model& m, const Case& c) {
  job::SingleDevice one(m.layers, pipetrain::test::mean_cross_entropy, c.optimizer == "sgd" ? sgd() : adam(), /*seed=*/0,
                        Precision::FP32, m.ties);
  std::vector<double> losses;
  for (int s = 0; s < kSteps; ++s) {
    const Batch b = make_batch(m, c.batch, 100 + s);
    losses.push_back(one.train_step(b.input, b.target));
  }
  return losses;
}

pipeline::PipelineOptions options(const Case& c) {
  pipeline::PipelineOptions o;
  o.stages = c.stages;
  o.micro_batches = c.micro_batches;
  o.schedule = schedule::parse_kind(c.schedule);
  o.chunks = schedule::uses_chunks(schedule::parse_kind(c.schedule)) ? 2 : 1;
  o.data_parallel = c.copies;
  o.shard_optimizer = c.shard;
  if (c.scatter) o.shard_reduction = pipeline::PipelineOptions::ShardReduction::ReduceScatter;
  o.bucket_bytes = 512;  // several buckets per stage
  o.transport.backend = pipetrain::comm::parse_backend(c.transport);
  o.timeout_s = 60;
  return o;
}

at::Tensor param(const models::Model& m, const models::ParamRef& ref) {
  return m.layers->ptr(ref.layer)->named_parameters()[ref.name];
}

// Each tie's members equal bit for bit (one weight), where this model holds both.
void expect_tied(const models::Model& m, const std::string& who) {
  for (const models::Tie& tie : m.ties)
    for (size_t i = 1; i < tie.size(); ++i) {
      const at::Tensor a = param(m, tie[0]), b = param(m, tie[i]);
      if (a.numel() > 0 && b.numel() > 0) EXPECT_TRUE(torch::equal(a, b)) << who << ": a tie's members differ";
    }
}

void expect_same(const models::Model& got, const models::Model& want, const std::string& who) {
  auto g = got.layers->named_parameters(), w = want.layers->named_parameters();
  int compared = 0;
  for (const auto& p : w) {
    const at::Tensor& t = g[p.key()];
    if (t.numel() == 0) continue;  // another rank's stage
    EXPECT_LT(pipetrain::test::rel_error(t, p.value()), 1e-10) << who << ": parameter " << p.key();
    ++compared;
  }
  EXPECT_GT(compared, 0) << who;
  auto gb = got.layers->named_buffers(), wb = want.layers->named_buffers();
  for (const auto& b : wb) {
    if (gb[b.key()].numel() > 0 && b.value().is_floating_point()) {
      EXPECT_LT(pipetrain::test::rel_error(gb[b.key()], b.value()), 1e-10) << who << ": buffer " << b.key();
    }
  }
}

class DataParallel : public ::testing::TestWithParam<Case> {};

TEST_P(DataParallel, CopiesEqualOneDeviceOnTheWholeBatch) {
  const Case& c = GetParam();
  if (!comm::has_transport_backend(c.transport)) GTEST_SKIP() << c.transport << " is not compiled in";
  models::Model want = build(c.family);
  const std::vector<double> want_losses = reference(want, c);
  pipeline::PipelineOptions o = options(c);
  o.ties = want.ties;
  const auto factory = c.optimizer == "sgd" ? sgd() : adam();

  if (!c.ranks) {
    models::Model got = build(c.family);
    pipeline::Pipeline pipe(got.layers, o, pipetrain::test::mean_cross_entropy);
    pipe.optimizers().set(factory);
    for (int s = 0; s < kSteps; ++s) {
      const Batch b = make_batch(got, c.batch, 100 + s);
      EXPECT_NEAR(pipe.train_step(b.input, b.target), want_losses[s], 1e-10 * std::abs(want_losses[s])) << "step " << s;
    }
    expect_same(got, want, "copy 0");
    expect_tied(got, "copy 0");
    // Every stage reduced its gradients once per step, after its last backward part; with a
    // sharded optimizer, the stages that hold a tie's members at the optimizer step instead.
    const int V = c.stages * o.chunks;
    const int held = c.shard && !o.ties.empty() ? (V > 1 ? 2 : 1) : 0;
    int reduces = 0;
    for (const auto& spans : pipe.last_trace().spans)
      for (const auto& sp : spans)
        if (sp.op == schedule::Op::Reduce) {
          ++reduces;
          EXPECT_GE(sp.end, sp.start);
        }
    EXPECT_EQ(reduces, V - held);
    return;
  }

  const int world = c.stages * c.copies;
  auto endpoints = comm::make_transport_group(o.transport, world);
  auto groups = comm::make_local_gloo_groups(c.stages, c.copies, o.timeout_s);
  std::vector<models::Model> models;
  for (int r = 0; r < world; ++r) models.push_back(build(c.family));
  std::vector<std::vector<double>> losses(world);
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        pipeline::Pipeline pipe(models[r].layers, o, pipetrain::test::mean_cross_entropy, std::move(endpoints[r]), groups[r / c.copies][r % c.copies]);
        EXPECT_EQ(pipe.rank(), r);
        EXPECT_EQ(pipe.copy(), r % c.copies);
        pipe.optimizers().set(factory);
        for (int s = 0; s < kSteps; ++s) {
          const Batch b = make_batch(models[r], c.batch, 100 + s);
          losses[r].push_back(pipe.train_step(b.input, b.target));
        }
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    if (errors[r]) {
      try {
        std::rethrow_exception(errors[r]);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
      continue;
    }
    for (int s = 0; s < kSteps; ++s)
      EXPECT_NEAR(losses[r][s], want_losses[s], 1e-10 * std::abs(want_losses[s])) << "rank " << r << " step " << s;
    expect_same(models[r], want, "rank " + std::to_string(r));
  }
  // Each copy's tie across its first and last ranks: the two members equal bit for bit.
  for (int copy = 0; copy < c.copies; ++copy)
    for (const models::Tie& tie : models[0].ties) {
      const at::Tensor first = param(models[copy], tie[0]);
      const at::Tensor last = param(models[(c.stages - 1) * c.copies + copy], tie.back());
      if (first.numel() > 0 && last.numel() > 0)
        EXPECT_TRUE(torch::equal(first, last)) << "copy " << copy << ": a tie's members differ across ranks";
    }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  // Threads: D=2 x K=2, D=2 x K=1, D=3 x K=2 with an uneven shard (11 = 4 + 4 + 3), each with and
  // without the sharded optimizer; a split backward (the reduction after the last W), an
  // interleaved schedule (one reduction per chunk), BatchNorm (statistics merged over copies).
  for (bool shard : {false, true}) {
    out.push_back({"mlp", "1f1b", 2, 2, 2, 12, shard});
    out.push_back({"mlp", "gpipe", 1, 2, 2, 8, shard, false, "local", "sgd"});
    out.push_back({"gpt", "zb-h1", 2, 3, 2, 11, shard});
    out.push_back({"mlp", "interleaved-1f1b", 2, 2, 2, 12, shard, false, "local", "sgd"});
    out.push_back({"cnn", "1f1b", 2, 2, 2, 12, shard});
  }
  // The processes code path: ranks over the local transport and over UCX, with Gloo.
  out.push_back({"mlp", "1f1b", 2, 2, 2, 12, false, true});
  out.push_back({"gpt", "zb-h1", 2, 3, 3, 20, true, true});
  out.push_back({"cnn", "gpipe", 2, 2, 2, 12, false, true, "ucx"});
  // A tie between each copy's first and last ranks: its gradients cross between those two alone.
  out.push_back({"gpt_tied", "1f1b", 3, 2, 3, 12, false, true});
  out.push_back({"gpt_tied", "gpipe", 3, 2, 3, 12, false, true, "ucx"});
  out.push_back({"mlp", "1f1b", 2, 2, 2, 12, true, true, "ucx", "sgd"});
  // Ties with a sharded optimizer: the ties summed within each copy before the tied stages
  // reduce, at the optimizer step; three copies (the members made equal after each step), the
  // tie inside one stage, across chunks of an interleaved schedule, a reduce-scatter, ranks.
  out.push_back({"gpt_tied", "1f1b", 3, 3, 3, 12, true});
  out.push_back({"gpt_tied", "gpipe", 1, 2, 2, 8, true, false, "local", "sgd"});
  out.push_back({"gpt_tied", "interleaved-1f1b", 2, 2, 2, 12, true, false, "local", "sgd"});
  out.push_back({"gpt_tied", "zb-h1", 2, 3, 2, 11, true, false, "local", "adamw", true});
  out.push_back({"gpt_tied", "1f1b", 3, 3, 3, 12, true, true});
  out.push_back({"gpt_tied", "gpipe", 2, 2, 2, 12, true, true, "ucx"});
  // The sharded reduction as a reduce-scatter (other backends' default).
  out.push_back({"gpt", "zb-h1", 2, 3, 2, 11, true, false, "local", "adamw", true});
  out.push_back({"mlp", "1f1b", 2, 2, 2, 12, true, true, "local", "sgd", true});
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string s = c.family + "_" + c.schedule + "_K" + std::to_string(c.stages) + "_D" + std::to_string(c.copies) +
                  (c.shard ? "_sharded" : "") + (c.ranks ? "_ranks_" : "_threads_") + c.transport + "_" + c.optimizer +
                  (c.scatter ? "_reduce_scatter" : "");
  for (char& ch : s)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Grid, DataParallel, ::testing::ValuesIn(cases()), case_name);

// One device's SGD step on the mean loss of two batches, each at the dropout streams the
// pipeline gives it (step 0, then 1), accumulated into `want`'s gradients.
void step_on_two_batches(models::Model& want, const Batch& b0, const Batch& b1) {
  auto opt = sgd()(want.layers->parameters());
  {
    RngContextGuard rng(RngContext{0, 0, 0});
    (pipetrain::test::mean_cross_entropy(want.layers->forward(b0.input), b0.target) * 0.5).backward();
  }
  {
    RngContextGuard rng(RngContext{0, 1, 0});
    (pipetrain::test::mean_cross_entropy(want.layers->forward(b1.input), b1.target) * 0.5).backward();
  }
  opt->step();
}

// Accumulated batches: no reduction until the last (sync off), then one; the step equals one
// device on the mean loss of the batches.
TEST(DataParallelAccumulate, ReducesOnceAfterTheLastBatch) {
  models::Model want = build("mlp"), got = build("mlp");
  const Batch b0 = make_batch(want, 8, 1), b1 = make_batch(want, 8, 2);
  step_on_two_batches(want, b0, b1);
  Case c{"mlp", "1f1b", 2, 2, 2, 8};
  pipeline::Pipeline pipe(got.layers, options(c), pipetrain::test::mean_cross_entropy);
  pipe.optimizers().set(sgd());
  pipe.sync_gradients(false);
  pipe.forward_backward(b0.input, b0.target, false, 0.5);
  for (const auto& spans : pipe.last_trace().spans)
    for (const auto& sp : spans) EXPECT_NE(sp.op, schedule::Op::Reduce);
  pipe.sync_gradients(true);
  pipe.forward_backward(b1.input, b1.target, true, 0.5);
  pipe.optimizers().step();
  expect_same(got, want, "after two accumulated batches");
}

// Accumulating onto gradients that were already reduced across the copies: a batch reduced (sync
// on), then one more accumulated, reduced at once (sync on) or left for the optimizer's step
// (sync off). The earlier batch's reduced gradients are not reduced again (that would count them
// once per copy) nor dropped (a sharded optimizer's slice): the step equals one device on both.
TEST(DataParallelAccumulate, OntoReducedGradientsCountsEachBatchOnce) {
  for (bool shard : {false, true})
    for (bool second_sync : {true, false}) {
      const std::string what = std::string(shard ? "sharded" : "unsharded") + (second_sync ? ", sync on" : ", sync off");
      models::Model want = build("mlp"), got = build("mlp");
      const Batch b0 = make_batch(want, 8, 1), b1 = make_batch(want, 8, 2);
      step_on_two_batches(want, b0, b1);
      Case c{"mlp", "1f1b", 2, 2, 2, 8, shard};
      pipeline::Pipeline pipe(got.layers, options(c), pipetrain::test::mean_cross_entropy);
      pipe.optimizers().set(sgd());
      pipe.forward_backward(b0.input, b0.target, false, 0.5);  // reduced at once
      pipe.sync_gradients(second_sync);
      pipe.forward_backward(b1.input, b1.target, true, 0.5);
      pipe.optimizers().step();
      expect_same(got, want, what);
    }
}

// A batch whose smallest shard has fewer samples than the micro-batch count (an epoch's last)
// runs as fewer micro-batches on every copy, and still equals one device's step on it.
TEST(DataParallelPartialBatch, ShardsSmallerThanTheMicroBatchesRunAsFewer) {
  models::Model want = build("mlp"), got = build("mlp");
  const Batch b = make_batch(want, 10, 1);
  auto opt = sgd()(want.layers->parameters());
  at::Tensor l;
  {
    RngContextGuard rng(RngContext{0, 0, 0});
    l = pipetrain::test::mean_cross_entropy(want.layers->forward(b.input), b.target);
  }
  l.backward();
  opt->step();
  Case c{"mlp", "1f1b", 2, 3, 4, 10};
  pipeline::Pipeline pipe(got.layers, options(c), pipetrain::test::mean_cross_entropy);
  pipe.optimizers().set(sgd());
  EXPECT_NEAR(pipe.train_step(b.input, b.target), l.item<double>(), 1e-10 * l.item<double>());
  EXPECT_EQ(pipe.fewest_micro_batches(), 3);  // 10 over 3 copies: shards of 4, 3 and 3
  expect_same(got, want, "after a step of 3 micro-batches per copy");
  try {
    pipe.train_step(b.input.narrow(0, 0, 2), b.target.narrow(0, 0, 2));
    FAIL() << "2 samples shared by 3 copies";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("a batch of 2 samples cannot be shared by 3 copies"), std::string::npos) << e.what();
  }
}

// The schedule's Reduce actions: after each chunk's last backward part, validated, simulated
// beside the later actions (the step ends when the last reduction has).
TEST(DataParallelSchedule, ReductionsFollowTheLastBackwardAndOverlap) {
  using schedule::Kind;
  for (const Kind kind : {Kind::GPipe, Kind::OneFOneB, Kind::ZbH1, Kind::Interleaved1F1B, Kind::ZbV, Kind::DualPipeV}) {
    const int chunks = schedule::info(kind).default_chunks;
    schedule::Schedule s = schedule::with_reductions(schedule::make_schedule(kind, 2, 4, chunks));
    EXPECT_NO_THROW(schedule::validate(s)) << kind;
    for (const auto& list : s.actions) {
      int reduces = 0;
      for (const auto& a : list) reduces += a.op == schedule::Op::Reduce;
      EXPECT_EQ(reduces, chunks) << kind;
    }
  }
  schedule::Schedule s = schedule::with_reductions(schedule::make_1f1b(2, 4));
  // A reduction moved before the last backward is refused.
  auto broken = s;
  auto& list = broken.actions[0];
  auto it = std::find_if(list.begin(), list.end(), [](const schedule::Action& a) { return a.op == schedule::Op::Reduce; });
  std::rotate(it - 1, it, it + 1);
  EXPECT_THROW(schedule::validate(broken), ScheduleError);
  // Device 1 (the last stage) finishes its backwards first: its reduction is hidden behind
  // device 0's remaining work; device 0's is exposed.
  schedule::Costs costs = schedule::Costs::uniform(2, 1.0, 1.0, 1.0);
  costs.reduce_ms = {3.0, 3.0};
  const auto with = schedule::simulate(s, costs);
  costs.reduce_ms = {0.0, 0.0};
  const auto without = schedule::simulate(s, costs);
  EXPECT_NEAR(with.makespan_ms, without.makespan_ms + 3.0, 1e-9);
  EXPECT_NEAR(with.exposed_reduce_ms[0], 3.0, 1e-9);
  EXPECT_LT(with.exposed_reduce_ms[1], 3.0);
}

}  // namespace
