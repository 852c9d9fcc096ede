#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include <torch/torch.h>

#include "comm/transport.h"
#include "common/error.h"
#include "profiler/profile.h"
#include "pipeline/pipeline.h"
#include "planner/plan.h"
#include "schedule/simulate.h"
#include "schedule/trace.h"
#include "tests/helpers.h"

#include <nlohmann/json.hpp>
#include <sstream>

using namespace pipetrain;
using namespace pipetrain::pipeline;
using namespace pipetrain::planner;
using pipetrain::test::Failing;

namespace {


torch::nn::Sequential mlp(int width, int layers) {
  torch::manual_seed(0);
  torch::nn::Sequential s;
  for (int i = 0; i < layers; ++i) {
    s->push_back("fc" + std::to_string(i), torch::nn::Linear(width, width));
    s->push_back("relu" + std::to_string(i), torch::nn::Functional(torch::relu));
  }
  return s;
}


bool overlaps(const Span& a, const Span& b) { return a.start < b.end && b.start < a.end; }

}  // namespace

// Two layers, one per stage, that meet: stage 0's forward of micro-batch 1 and stage 1's
// forward of micro-batch 0 each wait (up to a deadline) until the other one has started. A
// concurrent executor gets there at once; a sequential one cannot, because the stages would
// run one after the other and the waits would run out. Both waits lie inside the two forward
// spans, so those spans must overlap. No timing is asserted, only the order of events.
struct Meeting {
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  bool met = true;

  void arrive() {
    std::unique_lock<std::mutex> lock(mu);
    ++arrived;
    cv.notify_all();
    met &= cv.wait_for(lock, std::chrono::seconds(10), [&] { return arrived == 2; });
  }
};

struct ProbeImpl : torch::nn::Module {
  std::shared_ptr<Meeting> meeting;
  int meet_on_call, calls = 0;
  ProbeImpl(std::shared_ptr<Meeting> m, int meet_on_call) : meeting(std::move(m)), meet_on_call(meet_on_call) {}
  at::Tensor forward(const at::Tensor& x) {
    if (++calls == meet_on_call) meeting->arrive();
    return x;
  }
};
TORCH_MODULE(Probe);

TEST(Executor, StagesRunConcurrently) {
  auto meeting = std::make_shared<Meeting>();
  torch::manual_seed(0);
  torch::nn::Sequential model;
  model->push_back("fc0", torch::nn::Linear(16, 16));
  model->push_back("probe0", Probe(meeting, /*meet_on_call=*/2));  // stage 0, micro-batch 1
  model->push_back("probe1", Probe(meeting, /*meet_on_call=*/1));  // stage 1, micro-batch 0
  model->push_back("fc1", torch::nn::Linear(16, 16));
  PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 4;
  o.recompute = Recompute::Never;  // one forward call per micro-batch
  Pipeline pipe(model, o, pipetrain::test::mean_cross_entropy);
  pipe.forward_backward(torch::randn({8, 16}), torch::randint(0, 16, {8}, torch::kLong));
  EXPECT_TRUE(meeting->met && meeting->arrived == 2) << "the two stages never computed at the same time";

  // The per-stage timestamps show the same thing.
  const StepTrace& t = pipe.last_trace();
  ASSERT_EQ(t.spans.size(), 2u);
  int overlapping = 0;
  for (const Span& a : t.spans[0])
    for (const Span& b : t.spans[1])
      if (a.op == schedule::Op::Forward && b.op == schedule::Op::Forward && overlaps(a, b)) ++overlapping;
  EXPECT_GT(overlapping, 0);
  // Every action of the schedule was executed and timed.
  for (int r = 0; r < 2; ++r) EXPECT_EQ(t.spans[r].size(), pipe.schedule().actions[r].size());
  EXPECT_GT(t.wall, 0.0);
}

TEST(Executor, ErrorInOneStageStopsEveryStageAndNamesIt) {
  torch::nn::Sequential model;
  model->push_back("fc0", torch::nn::Linear(4, 4));
  model->push_back("fc1", torch::nn::Linear(4, 4));
  model->push_back("bad", Failing(2));  // fails on the second micro-batch
  model->push_back("fc3", torch::nn::Linear(4, 4));
  PipelineOptions o;
  o.stages = 4;
  o.micro_batches = 4;
  o.timeout_s = 60;  // far longer than the test: peers must be woken, not time out
  Pipeline pipe(model, o, pipetrain::test::mean_cross_entropy);
  auto x = torch::randn({8, 4});
  auto y = torch::randint(0, 4, {8}, torch::kLong);
  try {
    pipe.forward_backward(x, y);
    FAIL() << "the injected failure was not reported";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("stage 2: forward(mb 1): injected failure"), std::string::npos) << msg;
  }
  // The pipeline recovers: the next step runs on fresh mailboxes.
  EXPECT_NO_THROW(pipe.forward_backward(x, y));
}

TEST(Executor, SilentPeerTimesOutNamingTheRank) {
  // Stage 1 stays silent (stuck in its forward for 2 s); stage 0 waits for its gradient and
  // must give up after the 0.2 s timeout with a message naming rank 1.
  struct StuckImpl : torch::nn::Module {
    at::Tensor forward(const at::Tensor& x) {
      std::mutex mu;
      std::condition_variable never;
      std::unique_lock<std::mutex> lock(mu);
      never.wait_for(lock, std::chrono::seconds(2));
      return x;
    }
  };
  torch::nn::Sequential model;
  model->push_back("fc", torch::nn::Linear(4, 4));
  model->push_back("stuck", torch::nn::ModuleHolder<StuckImpl>(std::make_shared<StuckImpl>()));
  PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 1;
  o.timeout_s = 0.2;
  Pipeline pipe(model, o, pipetrain::test::mean_cross_entropy);
  std::string msg;
  try {
    pipe.forward_backward(torch::randn({2, 4}), torch::randint(0, 4, {2}, torch::kLong));
  } catch (const TimeoutError& e) {
    msg = e.what();
    EXPECT_EQ(e.peer(), 1);
  }
  EXPECT_EQ(msg, "rank 0: timed out waiting for gradient of micro-batch 0 (step 0) from rank 1");
}

// One Pipeline per rank (the multi-process constructor, ranks as threads): a rank whose
// construction fails tells its peers at once, naming itself, instead of leaving them to wait
// for its part of the stage layout until their deadline (60 s here). Over the local transport
// the peer gets the abort's reason; over UCX the failed rank's endpoint also closes right after
// its abort notice, so the peer sees either the notice or the closed connection, both naming
// rank 1.
TEST(Pipeline, ARankThatCannotBeConstructedFailsItsPeersAtOnce) {
  for (const std::string& backend : comm::transport_backends()) {
    if (backend == "nccl") continue;  // one GPU per process: the gpu tests
    SCOPED_TRACE(backend);
    PipelineOptions o;
    o.stages = 2;
    o.micro_batches = 2;
    o.timeout_s = 60;
    o.transport.backend = pipetrain::comm::parse_backend(backend);
    auto endpoints = comm::make_transport_group(o.transport, 2);
    std::string errors[2];
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        try {
          // Rank 1 gets a model of one layer: too few for two stages.
          torch::nn::Sequential one;
          one->push_back("fc", torch::nn::Linear(4, 4));
          Pipeline pipe(r == 0 ? mlp(4, 2) : one, o, pipetrain::test::mean_cross_entropy, std::move(endpoints[r]));
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : ranks) t.join();  // bounded by the 60 s deadline at worst
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
    EXPECT_NE(errors[1].find("need at least 2 layers"), std::string::npos) << errors[1];
    EXPECT_NE(errors[0].find("the stage layout"), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find("rank 1"), std::string::npos) << errors[0];
    if (backend == "local") {
      EXPECT_NE(errors[0].find("rank 1 failed: pipeline: 2 stages need at least 2 layers but the model has only 1"),
                std::string::npos)
          << errors[0];
    }
  }
}

TEST(Pipeline, UnevenBatchGivesTheExactMeanLoss) {
  auto model = mlp(8, 3);
  model->to(torch::kDouble);
  auto x = torch::randn({7, 8}, torch::kDouble);
  auto y = torch::randint(0, 8, {7}, torch::kLong);
  const double whole = pipetrain::test::mean_cross_entropy(model->forward(x), y).item<double>();
  PipelineOptions o;
  o.stages = 3;
  o.micro_batches = 3;  // 3 + 2 + 2 samples
  Pipeline pipe(model, o, pipetrain::test::mean_cross_entropy);
  EXPECT_NEAR(pipe.forward_backward(x, y), whole, 1e-12);
}

TEST(Pipeline, TrainStepUpdatesTheCallersModelAndLowersTheLoss) {
  auto model = mlp(16, 3);
  PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 4;
  Pipeline pipe(model, o, pipetrain::test::mean_cross_entropy);
  pipe.optimizers().set([](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1).momentum(0.9));
  });
  auto before = model->named_parameters()["fc0.weight"].clone();
  auto x = torch::randn({32, 16});
  auto y = torch::randint(0, 16, {32}, torch::kLong);
  const double first = pipe.train_step(x, y);
  double last = first;
  for (int i = 0; i < 20; ++i) last = pipe.train_step(x, y);
  EXPECT_LT(last, first);
  EXPECT_FALSE(torch::equal(before, model->named_parameters()["fc0.weight"]));
  EXPECT_EQ(pipe.step(), 21);
  EXPECT_EQ(pipe.predict(x).sizes(), (std::vector<int64_t>{32, 16}));
}

TEST(Pipeline, OptimizerStepMatchesSingleDevice) {
  for (const char* kind : {"sgd", "adamw"}) {
    auto a = mlp(8, 2), b = mlp(8, 2);
    a->to(torch::kDouble);
    b->to(torch::kDouble);
    auto make = [&](std::vector<at::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
      if (std::string(kind) == "sgd")
        return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1).momentum(0.9));
      return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
    };
    auto x = torch::randn({12, 8}, torch::kDouble);
    auto y = torch::randint(0, 8, {12}, torch::kLong);
    auto opt = make(a->parameters());
    PipelineOptions o;
    o.stages = 2;
    o.micro_batches = 3;
    Pipeline pipe(b, o, pipetrain::test::mean_cross_entropy);
    pipe.optimizers().set(make);
    for (int s = 0; s < 3; ++s) {
      opt->zero_grad();
      pipetrain::test::mean_cross_entropy(a->forward(x), y).backward();
      opt->step();
      pipe.train_step(x, y);
    }
    auto pa = a->named_parameters(), pb = b->named_parameters();
    for (const auto& p : pa) EXPECT_TRUE(torch::allclose(p.value(), pb[p.key()], 1e-10, 1e-12)) << kind << " " << p.key();
  }
}

TEST(Pipeline, BadOptionsAreErrors) {
  auto model = mlp(4, 1);  // 2 layers
  PipelineOptions o;
  o.stages = 3;
  EXPECT_THROW(Pipeline(model, o, pipetrain::test::mean_cross_entropy), ConfigError);
  o.stages = 2;
  o.balance = {1, 2};
  EXPECT_THROW(Pipeline(model, o, pipetrain::test::mean_cross_entropy), ConfigError);
  o.balance = {};
  o.micro_batches = 4;
  Pipeline pipe(model, o, pipetrain::test::mean_cross_entropy);
  // Fewer samples than micro-batches (an epoch's short last batch) run as fewer micro-batches.
  pipe.forward_backward(torch::randn({3, 4}), torch::randint(0, 4, {3}, torch::kLong));
  EXPECT_EQ(pipe.fewest_micro_batches(), 3);
  EXPECT_THROW(pipe.forward_backward(torch::randn({3, 4}), torch::randint(0, 4, {2}, torch::kLong)), ConfigError);
}

// The executor holds as many micro-batches at once as the simulator predicts from the same
// lists, for every schedule: all M for gpipe, at most K - r on stage r for 1f1b and zb-h1.
TEST(Executor, InFlightMicroBatchesMatchTheSimulator) {
  struct Case {
    std::string kind;
    int stages, micro_batches, chunks;
  };
  for (const Case& c : {Case{"gpipe", 4, 8, 1}, Case{"1f1b", 4, 8, 1}, Case{"zb-h1", 4, 8, 1},
                        Case{"interleaved-1f1b", 2, 4, 2}, Case{"1f1b", 3, 2, 1}, Case{"zb-h2", 4, 8, 1},
                        Case{"looped-bfs", 2, 3, 2}, Case{"zb-v", 2, 5, 2}, Case{"dualpipev", 2, 4, 2},
                        Case{"zb-auto", 3, 6, 1}}) {
    PipelineOptions o;
    o.stages = c.stages;
    o.micro_batches = c.micro_batches;
    o.schedule = schedule::parse_kind(c.kind);
    o.chunks = c.chunks;
    o.recompute = Recompute::Never;
    Pipeline pipe(mlp(8, 4), o, pipetrain::test::mean_cross_entropy);
    pipe.forward_backward(torch::randn({16, 8}), torch::randint(0, 8, {16}, torch::kLong));
    const auto sim = schedule::simulate(pipe.schedule(), schedule::Costs::uniform(c.stages * c.chunks, 1, 1, 1));
    EXPECT_EQ(pipe.last_trace().peak_in_flight, sim.peak_in_flight) << c.kind;
    EXPECT_EQ(pipe.last_trace().peak_awaiting_weight, sim.peak_awaiting_weight) << c.kind;
  }
}

// dualpipev fuses some backwards of a virtual stage and splits others: the measured costs keep
// the fused one apart, so the simulator does not charge a fused backward B + W twice over.
TEST(Executor, MeasuredCostsKeepFusedAndSplitBackwardsApart) {
  PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 4;
  o.schedule = schedule::parse_kind("dualpipev");
  o.chunks = 2;
  o.recompute = Recompute::Never;
  Pipeline pipe(mlp(8, 4), o, pipetrain::test::mean_cross_entropy);
  pipe.forward_backward(torch::randn({16, 8}), torch::randint(0, 8, {16}, torch::kLong));
  const auto c = measured_costs(pipe.last_trace(), pipe.schedule());
  ASSERT_EQ(c.backward_fused.size(), 4u);
  int both = 0;
  for (double f : c.backward_fused) both += f >= 0;
  EXPECT_GT(both, 0);
  EXPECT_NO_THROW(schedule::simulate(pipe.schedule(), c));
}

// A measured step turns into a timeline (a recompute span before each recomputing backward)
// and into per-op costs the simulator accepts.
TEST(Executor, TimelineAndMeasuredCosts) {
  PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 3;
  o.schedule = schedule::parse_kind("zb-h1");
  o.recompute = Recompute::ExceptLast;
  Pipeline pipe(mlp(8, 4), o, pipetrain::test::mean_cross_entropy);
  pipe.forward_backward(torch::randn({6, 8}), torch::randint(0, 8, {6}, torch::kLong));
  const StepTrace& t = pipe.last_trace();
  auto tl = timeline(t, t.start);
  ASSERT_EQ(tl.size(), 2u);
  int recomputes = 0;
  for (const auto& stage : tl)
    for (size_t i = 0; i < stage.size(); ++i) {
      EXPECT_LE(stage[i].start_ms, stage[i].end_ms);
      if (i) {
        EXPECT_LE(stage[i - 1].end_ms, stage[i].start_ms + 1e-9);
      }
      if (stage[i].name == "recompute") {
        ++recomputes;
        ASSERT_LT(i + 1, stage.size());
        EXPECT_EQ(stage[i + 1].name, "backward_input");
        EXPECT_EQ(stage[i + 1].micro_batch, stage[i].micro_batch);
      }
    }
  EXPECT_EQ(recomputes, 2 * 2);  // micro-batches 0 and 1 on both stages
  schedule::Costs c = measured_costs(t, pipe.schedule());
  EXPECT_EQ(c.recomputed, (std::vector<bool>{true, true, false}));
  for (int v = 0; v < 2; ++v) {
    EXPECT_GT(c.forward[v], 0.0);
    EXPECT_GT(c.backward_weight[v], 0.0);
    EXPECT_GT(c.recompute[v], 0.0);
  }
  const auto sim = schedule::simulate(pipe.schedule(), c);
  EXPECT_GT(sim.makespan_ms, 0.0);
  std::ostringstream json;
  schedule::write_chrome_trace(json, {{"measured", tl, "", {}}, {"simulated", {}, "", {}}});
  const auto parsed = nlohmann::json::parse(json.str());
  int complete = 0;
  for (const auto& e : parsed["traceEvents"]) complete += e["ph"] == "X";
  size_t spans = 0;
  for (const auto& stage : tl) spans += stage.size();
  EXPECT_GE(complete, static_cast<int>(spans));
}

// The profiler measures each layer as a stage: exact parameter and output bytes, saved bytes
// that include the output, positive times, and a B/W split for layers after the first.
TEST(Profile, MeasuresEachLayer) {
  auto model = mlp(16, 2);  // fc0 relu0 fc1 relu1
  model->to(torch::kDouble);
  auto x = torch::randn({8, 16}, torch::kDouble);
  auto y = torch::randint(0, 16, {8}, torch::kLong);
  profiler::ProfileOptions o;
  o.warmup = 1;
  o.repeat = 3;
  const auto p = profiler::profile_layers(model, x, y, pipetrain::test::mean_cross_entropy, o);
  ASSERT_EQ(p.layers.size(), 4u);
  EXPECT_EQ(p.input_bytes, 8 * 16 * 8);
  EXPECT_EQ(p.layers[0].name, "fc0");
  EXPECT_EQ(p.layers[0].param_bytes, (16 * 16 + 16) * 8);
  EXPECT_EQ(p.layers[1].param_bytes, 0);
  EXPECT_EQ(p.layers[0].activation_bytes, 8 * 16 * 8);
  EXPECT_EQ(p.layers[3].activation_bytes, 0);  // the last layer's output goes to the loss
  EXPECT_GE(p.layers[0].saved_bytes, p.layers[0].activation_bytes);
  EXPECT_GT(p.layers[2].saved_bytes, 0);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_GT(p.layers[i].forward_ms, 0.0) << i;
    EXPECT_GT(p.layers[i].backward_ms, 0.0) << i;
  }
  EXPECT_GT(p.backward_weight_ms[2], 0.0);
  EXPECT_GT(p.backward_input_ms[2], 0.0);
  for (auto& param : model->parameters()) EXPECT_FALSE(param.grad().defined()) << "profiling leaves no gradients";

  const std::string path = ::testing::TempDir() + "/pipetrain_costs_" + std::to_string(::getpid()) + ".json";
  profiler::save_costs(path, p);
  const auto back = partitioner::load_costs(path);
  ASSERT_EQ(back.size(), 4u);
  EXPECT_EQ(back[0].param_bytes, p.layers[0].param_bytes);
  EXPECT_EQ(back[2].saved_bytes, p.layers[2].saved_bytes);
  EXPECT_DOUBLE_EQ(back[1].forward_ms, p.layers[1].forward_ms);
}

// The simulator's cost table of a balance: sums per stage, recomputation per micro-batch, and
// for the split backward the first stage doing all of its backward in W.
TEST(Profile, ScheduleCostsOfABalance) {
  profiler::Profile p;
  for (int i = 0; i < 4; ++i) {
    p.layers.push_back({"l" + std::to_string(i), 1.0 + i, 2.0 + i, 0, 10, 10});
    p.backward_input_ms.push_back(1.0);
    p.backward_weight_ms.push_back(1.0 + i);
  }
  const auto s = schedule::make_schedule(schedule::parse_kind("zb-h1"), 2, 3);
  const auto c = schedule_costs(p, {1, 3}, s, Recompute::ExceptLast);
  EXPECT_DOUBLE_EQ(c.forward[0], 1.0);
  EXPECT_DOUBLE_EQ(c.forward[1], 2.0 + 3.0 + 4.0);
  EXPECT_DOUBLE_EQ(c.backward_input[0], 0.0);  // the first stage's input needs no gradient
  EXPECT_DOUBLE_EQ(c.backward_weight[0], 2.0);
  EXPECT_DOUBLE_EQ(c.backward_input[1], 3.0);
  EXPECT_DOUBLE_EQ(c.backward_weight[1], 2.0 + 3.0 + 4.0);
  EXPECT_EQ(c.recomputed, (std::vector<bool>{true, true, false}));
  const auto g = schedule_costs(p, {1, 3}, schedule::make_gpipe(2, 3), Recompute::Never);
  EXPECT_DOUBLE_EQ(g.backward_input[1], 3.0 + 4.0 + 5.0);
  EXPECT_DOUBLE_EQ(g.backward_weight[1], 0.0);
  EXPECT_GT(schedule::simulate(s, c).makespan_ms, 0.0);
}

namespace {
// Three linear layers and a layer that fails on its `fail_at`-th forward call, first or last.
torch::nn::Sequential failing_model(int fail_at, bool bad_first) {
  torch::manual_seed(3);
  torch::nn::Sequential model;
  if (bad_first) model->push_back("bad", Failing(fail_at));
  model->push_back("fc0", torch::nn::Linear(4, 4));
  model->push_back("fc1", torch::nn::Linear(4, 4));
  model->push_back("fc2", torch::nn::Linear(4, 4));
  if (!bad_first) model->push_back("bad", Failing(fail_at));
  return model;
}
}  // namespace

// Optimizers step only after every stage has finished: a step that fails anywhere leaves every
// parameter as it was, and the next step trains normally. Here the first stage fails in its
// very last action (the recomputation of micro-batch 0, its 8th forward call), when the other
// stages have already finished their lists.
TEST(Executor, FailedStepChangesNoParameter) {
  auto model = failing_model(/*fail_at=*/8, /*bad_first=*/true);
  PipelineOptions o;
  o.stages = 4;
  o.micro_batches = 4;
  o.recompute = Recompute::Always;
  Pipeline pipe(model, o, pipetrain::test::mean_cross_entropy);
  pipe.optimizers().set([](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 0.5); });
  std::vector<at::Tensor> before;
  for (auto& p : model->parameters()) before.push_back(p.detach().clone());
  auto x = torch::randn({8, 4});
  auto y = torch::randint(0, 4, {8}, torch::kLong);
  try {
    pipe.train_step(x, y);
    FAIL() << "the injected failure was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stage 0: backward(mb 0)"), std::string::npos) << e.what();
  }
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], before[i])) << i;
  pipe.train_step(x, y);
  EXPECT_FALSE(torch::equal(params[0], before[0]));
}

// A zb-h1 step that fails after some backward_input passes but before their backward_weight
// leaves nothing behind: the next step's gradients equal those of a pipeline that never failed.
TEST(Executor, ZeroBubbleStartsCleanAfterAFailedStep) {
  PipelineOptions o;
  o.stages = 4;
  o.micro_batches = 4;
  o.schedule = schedule::parse_kind("zb-h1");
  o.recompute = Recompute::Never;
  auto failed_model = failing_model(/*fail_at=*/2, false), clean_model = failing_model(/*fail_at=*/0, false);
  Pipeline failed(failed_model, o, pipetrain::test::mean_cross_entropy), clean(clean_model, o, pipetrain::test::mean_cross_entropy);
  auto x1 = torch::randn({8, 4}), x2 = torch::randn({8, 4});
  auto y = torch::randint(0, 4, {8}, torch::kLong);
  EXPECT_THROW(failed.forward_backward(x1, y), Error);
  failed.forward_backward(x2, y);
  clean.forward_backward(x2, y);
  auto a = failed_model->parameters(), b = clean_model->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].grad().defined()) << i;
    EXPECT_TRUE(torch::allclose(a[i].grad(), b[i].grad(), 1e-6, 1e-7)) << i;
  }
}

namespace {
torch::nn::Sequential mlp64(int width, int layers) {
  auto m = mlp(width, layers);
  m->to(torch::kDouble);
  return m;
}
}  // namespace

// Gradient accumulation: two half batches with scale 1/2 give the gradient of the mean loss
// over the whole batch, as one device computes it.
// Clipping uses the norm of every stage's gradients together: with plain SGD (lr 1) the whole
// update has exactly the clip's norm, which per-stage clipping would not give.
TEST(Controls, GlobalGradientClipping) {
  auto model = mlp64(8, 4);
  PipelineOptions o;
  o.stages = 4;
  o.micro_batches = 2;
  Pipeline pipe(model, o, pipetrain::test::mean_cross_entropy);
  pipe.optimizers().set([](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 1.0); });
  auto x = torch::randn({8, 8}, torch::kDouble);
  auto y = torch::randint(0, 8, {8}, torch::kLong);
  pipe.forward_backward(x, y);
  double sq = 0;
  std::vector<at::Tensor> before;
  for (auto& p : model->parameters()) {
    sq += p.grad().pow(2).sum().item<double>();
    before.push_back(p.detach().clone());
  }
  const double clip = 0.25 * std::sqrt(sq);
  pipe.optimizers().set_grad_clip(clip);
  EXPECT_NEAR(pipe.optimizers().step(), std::sqrt(sq), 1e-9 * std::sqrt(sq));
  double update = 0;
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) update += (params[i] - before[i]).pow(2).sum().item<double>();
  EXPECT_NEAR(std::sqrt(update), clip, 1e-5 * clip);
  EXPECT_THROW(pipe.optimizers().set_grad_clip(-1), ConfigError);
  pipe.optimizers().set_learning_rate(0.0);  // no update at all
  pipe.forward_backward(x, y);
  for (auto& p : params) before.push_back(p.detach().clone());
  pipe.optimizers().step();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], before[params.size() + i])) << i;
}

// A NaN in one stage's gradient is caught before any optimizer steps, naming that stage.
TEST(Controls, NonFiniteGradientNamesTheStageAndChangesNothing) {
  auto model = mlp64(8, 4);
  PipelineOptions o;
  o.stages = 4;
  o.micro_batches = 2;
  Pipeline pipe(model, o, pipetrain::test::mean_cross_entropy);
  pipe.optimizers().set([](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 0.1); });
  pipe.optimizers().check_finite_grads(true);
  auto x = torch::randn({8, 8}, torch::kDouble);
  auto y = torch::randint(0, 8, {8}, torch::kLong);
  pipe.forward_backward(x, y);
  std::vector<at::Tensor> before;
  for (auto& p : model->parameters()) before.push_back(p.detach().clone());
  auto stage2 = pipe.stage_layers(2)->parameters();
  ASSERT_FALSE(stage2.empty());
  stage2[0].mutable_grad()[0][0] = std::numeric_limits<double>::quiet_NaN();
  try {
    pipe.optimizers().step();
    FAIL() << "the NaN gradient was not reported";
  } catch (const NonFiniteGradient& e) {
    EXPECT_EQ(e.stage(), 2);
    EXPECT_NE(std::string(e.what()).find("stage 2: the gradient is not finite"), std::string::npos) << e.what();
  }
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], before[i])) << i;
}
