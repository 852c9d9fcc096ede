// The small parts the engine is built from, each on its own: the mesh of ranks, the fork-join
// over workers, files written whole or not at all, the optimizer-state codec and the step
// result the ranks exchange.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <iostream>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include <torch/torch.h>

#include "comm/mesh.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "job/cross_entropy.h"
#include "job/fused_optimizers.h"
#include "job/job.h"
#include "models/layers.h"
#include "pipeline/optimizer_state.h"
#include "pipeline/pipeline.h"
#include "pipeline/step_trace.h"
#include "pipeline/worker.h"
#include "schedule/kinds.h"
#include "stages/device.h"

using namespace pipetrain;

TEST(Mesh, RanksAreStageMajorAndRoundTrip) {
  const comm::Mesh mesh{3, 2};
  EXPECT_EQ(mesh.world(), 6);
  for (int stage = 0; stage < 3; ++stage)
    for (int copy = 0; copy < 2; ++copy) {
      const int r = mesh.rank(stage, copy);
      EXPECT_EQ(r, stage * 2 + copy);  // pipeline outer, data inner
      EXPECT_EQ(mesh.stage_of(r), stage);
      EXPECT_EQ(mesh.copy_of(r), copy);
    }
  EXPECT_THROW(mesh.rank(3, 0), InternalError);
  EXPECT_THROW(mesh.stage_of(6), InternalError);
}

TEST(ForkJoin, RunsEveryJobAndReturnsTheFirstError) {
  std::vector<std::unique_ptr<pipeline::Worker>> workers;
  for (int i = 0; i < 4; ++i) workers.push_back(std::make_unique<pipeline::Worker>("w", 1));
  std::atomic<int> ran{0};
  bool here = false;
  EXPECT_FALSE(pipeline::fork_join(workers, {0, 1, 2, 3}, [&](int) { ++ran; }, [&] { here = true; }));
  EXPECT_EQ(ran.load(), 4);
  EXPECT_TRUE(here);
  // Workers 1 and 3 fail: every job still runs to its end, each error is kept by index, and
  // the first in `which` order is returned.
  std::vector<std::exception_ptr> errors;
  ran = 0;
  auto first = pipeline::fork_join(
      workers, {3, 1, 2},
      [&](int i) {
        ++ran;
        if (i % 2) throw std::runtime_error("worker " + std::to_string(i));
      },
      nullptr, &errors);
  EXPECT_EQ(ran.load(), 3);
  ASSERT_EQ(errors.size(), 4u);
  EXPECT_FALSE(errors[0]);
  EXPECT_TRUE(errors[1] && errors[3]);
  try {
    std::rethrow_exception(first);
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "worker 3");
  }
  // The calling thread's error comes first.
  first = pipeline::fork_join(workers, {0}, [](int) { throw std::runtime_error("worker"); },
                              [] { throw std::runtime_error("here"); });
  try {
    std::rethrow_exception(first);
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "here");
  }
}

TEST(AtomicFile, ReplacesWholeOrLeavesTheOldFile) {
  const std::string dir = ::testing::TempDir() + "/pipetrain_atomic_" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  const std::string path = dir + "/f.json";
  write_file_atomically(path, std::string("old\n"));
  write_file_atomically(path, std::string("new\n"));
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  EXPECT_EQ(text.str(), "new\n");
  EXPECT_FALSE(std::ifstream(path + ".partial").good());
  // A target that cannot be replaced (a directory): IoError naming it, no partial file left.
  ASSERT_EQ(std::system(("mkdir -p " + dir + "/d && touch " + dir + "/d/x").c_str()), 0);
  try {
    write_file_atomically(dir + "/d", std::string("x"));
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/d"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::ifstream(dir + "/d.partial").good());
  // A full disk (/dev/full where there is one) fails the write and keeps nothing.
  if (std::ifstream("/dev/full").good()) {
    EXPECT_THROW(write_file_synced("/dev/full", "x", 1), IoError);
  }
  std::system(("rm -rf " + dir).c_str());
}

// Every kind's state goes to data and back unchanged, a deep copy shares no storage, a state
// that holds part of its fields is refused by name, and one that holds none is no state.
TEST(OptimizerState, EveryKindRoundTripsThroughTheCodec) {
  for (const std::string& name : optimizer_names()) {
    SCOPED_TRACE(name);
    const OptimizerKind kind = parse_optimizer(name);
    torch::manual_seed(0);
    auto w = torch::randn({3, 2}, torch::requires_grad());
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (kind == OptimizerKind::SGD)
      opt = std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{w}, torch::optim::SGDOptions(0.1).momentum(0.9));
    else if (kind == OptimizerKind::Adam)
      opt = std::make_unique<torch::optim::Adam>(std::vector<at::Tensor>{w}, torch::optim::AdamOptions(0.1));
    else
      opt = std::make_unique<torch::optim::AdamW>(std::vector<at::Tensor>{w}, torch::optim::AdamWOptions(0.1));
    for (int i = 0; i < 2; ++i) {
      opt->zero_grad();
      (w * w).sum().backward();
      opt->step();
    }
    const auto& state = *opt->state().begin()->second;
    ASSERT_EQ(pipeline::kind_of(state), kind);
    const pipeline::ParamState data = pipeline::to_param_state(state);
    EXPECT_EQ(data.step, pipeline::info(kind).counts_steps ? 2 : 0);
    for (const auto& f : pipeline::info(kind).required) ASSERT_TRUE(data.tensors.count(f)) << f;
    auto copy = pipeline::deep_copy(state);
    const pipeline::ParamState back = pipeline::to_param_state(*copy);
    EXPECT_EQ(back.step, data.step);
    ASSERT_EQ(back.tensors.size(), data.tensors.size());
    for (const auto& [field, t] : data.tensors) {
      EXPECT_TRUE(torch::equal(back.tensors.at(field), t)) << field;
      EXPECT_NE(back.tensors.at(field).data_ptr(), t.data_ptr()) << field << " shares storage";
    }
    EXPECT_EQ(pipeline::state_bytes(*opt), static_cast<int64_t>(data.tensors.size() * 6 * sizeof(float)));
    pipeline::ParamState part = data;
    part.tensors.erase(pipeline::info(kind).required.back());
    if (part.tensors.empty() && !pipeline::info(kind).counts_steps) {
      EXPECT_EQ(pipeline::make_param_state(part), nullptr);  // SGD without its one field: nothing
    } else {
      EXPECT_THROW(pipeline::make_param_state(part), Error);
    }
    EXPECT_EQ(pipeline::make_param_state(pipeline::ParamState{kind, 0, {}}), nullptr);
  }
  EXPECT_THROW(parse_optimizer("lamb"), ConfigError);
}

TEST(StepResult, RoundTripsAndRefusesMalformedNumbers) {
  pipeline::StepResult r{{0.5, 0.25, 0.125}, 3, 1, {}};
  r.spans.push_back({schedule::Op::Forward, 2, 1, 0.001, 0.002, 0});
  r.spans.push_back({schedule::Op::Reduce, -1, 0, 0.003, 0.004, 0});
  const std::vector<double> v = pipeline::encode_step_result(r);
  const pipeline::StepResult back = pipeline::decode_step_result(v.data(), static_cast<int64_t>(v.size()), 3);
  EXPECT_EQ(back.losses, r.losses);
  EXPECT_EQ(back.peak_in_flight, 3);
  EXPECT_EQ(back.peak_awaiting_weight, 1);
  ASSERT_EQ(back.spans.size(), 2u);
  EXPECT_EQ(back.spans[0].op, schedule::Op::Forward);
  EXPECT_EQ(back.spans[1].micro_batch, -1);
  EXPECT_DOUBLE_EQ(back.spans[1].end, 0.004);
  auto refused = [&](std::vector<double> bad, int micro_batches, const char* why) {
    try {
      pipeline::decode_step_result(bad.data(), static_cast<int64_t>(bad.size()), micro_batches);
      ADD_FAILURE() << why << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused({}, 3, "of 0 values");
  refused(v, 4, "3 losses for 4 micro-batches");
  refused(std::vector<double>(v.begin(), v.end() - 1), 3, "values for 3 losses and 2 spans");
  std::vector<double> huge = v;
  huge[1] = 1e12;  // a count that would allocate beyond what was sent
  refused(huge, 3, "claiming");
  std::vector<double> code = v;
  code[2 + 3 + 2] = 42;  // the first span's action
  refused(code, 3, "unknown action code 42");
  std::vector<double> nan = v;
  nan[2 + 3] = std::numeric_limits<double>::quiet_NaN();
  refused(nan, 3, "peaks");
}

// A step in parts: every instant of a stage's step belongs to one part, so the parts add up to
// the wall time; a backward's recomputation is taken out of it, a reduction counts only where the
// stage waits for it after its list.
TEST(StepBreakdown, PartsTileEachStagesStep) {
  using schedule::Op;
  pipeline::StepTrace t;
  t.wall = 1.0;
  t.spans = {{{Op::Forward, 0, 0, 0.1, 0.3}, {Op::SendActivation, 0, 0, 0.3, 0.32}, {Op::RecvGrad, 0, 0, 0.35, 0.5},
              {Op::Backward, 0, 0, 0.5, 0.8, 0.1}, {Op::Reduce, -1, 0, 0.8, 0.85}},
             {{Op::RecvActivation, 0, 0, 0.0, 0.32}, {Op::Forward, 0, 0, 0.32, 0.4}, {Op::BackwardInput, 0, 0, 0.4, 0.5},
              {Op::SendGrad, 0, 0, 0.5, 0.5}, {Op::BackwardWeight, 0, 0, 0.5, 0.7}}};
  t.optimizer = {{0.9, 0.95}, {0.9, 1.0}};
  t.page_faults = {12, -1};
  const auto b = pipeline::breakdown(t);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_NEAR(b[0].idle_start, 0.1, 1e-12);
  EXPECT_NEAR(b[0].forward, 0.2, 1e-12);
  EXPECT_NEAR(b[0].send, 0.02, 1e-12);
  EXPECT_NEAR(b[0].between, 0.03, 1e-12);
  EXPECT_NEAR(b[0].wait_grad, 0.15, 1e-12);
  EXPECT_NEAR(b[0].recompute, 0.1, 1e-12);
  EXPECT_NEAR(b[0].backward, 0.2, 1e-12);
  EXPECT_NEAR(b[0].reduce_wait, 0.05, 1e-12);
  EXPECT_NEAR(b[0].end_wait, 0.05, 1e-12);
  EXPECT_NEAR(b[0].optimizer, 0.05, 1e-12);
  EXPECT_NEAR(b[0].idle_end, 0.05, 1e-12);
  EXPECT_EQ(b[0].page_faults, 12);
  EXPECT_NEAR(b[1].wait_input, 0.32, 1e-12);
  EXPECT_NEAR(b[1].backward_input, 0.1, 1e-12);
  EXPECT_NEAR(b[1].backward_weight, 0.2, 1e-12);
  EXPECT_NEAR(b[1].end_wait, 0.2, 1e-12);
  EXPECT_NEAR(b[1].idle_end, 0.0, 1e-12);
  EXPECT_EQ(b[1].page_faults, -1);
  for (const auto& s : b) EXPECT_NEAR(s.total(), t.wall, 1e-12);
}

// The same on a real step of every runtime path bench uses (threads, 1F1B and zero-bubble, with
// recomputation): each stage's parts add up to the executor's wall time, compute is there, and
// each stage's worker counted its page faults.
TEST(StepBreakdown, ARealStepAddsUpToItsWallTime) {
  for (const char* kind : {"1f1b", "zb-h1"}) {
    torch::manual_seed(0);
    torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 16), torch::nn::Tanh(),
                                torch::nn::Linear(16, 4));
    pipeline::PipelineOptions o;
    o.stages = 2;
    o.micro_batches = 4;
    o.schedule = schedule::parse_kind(kind);
    o.recompute = Recompute::Always;
    pipeline::Pipeline pipe(model, o, [](const at::Tensor& out, const at::Tensor& y) {
      return torch::nn::functional::cross_entropy(out, y);
    });
    pipe.optimizers().set([](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1)); });
    pipe.train_step(torch::randn({16, 8}), torch::randint(0, 4, {16}, torch::kLong));
    const pipeline::StepTrace& t = pipe.last_trace();
    const auto b = pipeline::breakdown(t);
    ASSERT_EQ(b.size(), 2u) << kind;
    for (size_t s = 0; s < b.size(); ++s) {
      EXPECT_NEAR(b[s].total(), t.wall, 1e-9) << kind << " stage " << s;
      EXPECT_GT(b[s].forward, 0) << kind;
      EXPECT_GT(b[s].recompute, 0) << kind;
      EXPECT_GT(b[s].optimizer, 0) << kind;
      EXPECT_GE(b[s].page_faults, 0) << kind;
    }
    EXPECT_GT(b[1].wait_input, 0) << kind;  // the last stage waits for its first input
    if (std::string(kind) == "zb-h1") EXPECT_GT(b[1].backward_weight, 0);
  }
}

// The door every host read of a step goes through (stages::DeviceContext::to_host) and the
// waits for a device's work are counted by the contexts that keep work apart from the host.
TEST(HostReads, TheCheckingContextCountsThem) {
  auto c = stages::make_device_context(c10::Device(c10::kCPU), /*checking=*/true);
  EXPECT_EQ(c->host_reads(), 0);
  const at::Tensor t = torch::arange(4.0);
  stages::Received got = c->receive(t, {});
  c->wait(got.ready);  // a stream's wait, not the host's
  EXPECT_EQ(c->host_reads(), 0);
  EXPECT_TRUE(torch::equal(c->to_host(got.tensor), t));
  c->synchronize();
  EXPECT_EQ(c->host_reads(), 2);
}

// No host read inside a step: on the checking context (which counts them as a GPU's would cost a
// synchronization), every schedule's list on 3 stages runs with none between its first and last
// action, with and without recomputation; the losses are read once after the list.
TEST(HostReads, NoneInsideAStepOnTheCheckingContext) {
  int runs = 0;
  for (const schedule::Kind kind : schedule::all_kinds())
    for (const Recompute recompute : {Recompute::Never, Recompute::Always}) {
      torch::manual_seed(0);
      torch::nn::Sequential model;
      for (int i = 0; i < 6; ++i) {
        model->push_back(torch::nn::Linear(8, 8));
        model->push_back(torch::nn::Tanh());
      }
      pipeline::PipelineOptions o;
      o.stages = 3;
      o.micro_batches = 6;
      o.schedule = kind;
      o.chunks = schedule::info(kind).min_chunks;
      o.recompute = recompute;
      o.checking_contexts = true;
      pipeline::Pipeline pipe(model, o, [](const at::Tensor& out, const at::Tensor& y) {
        return torch::nn::functional::cross_entropy(out, y);
      });
      pipe.optimizers().set(
          [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1)); });
      const double loss = pipe.train_step(torch::randn({12, 8}), torch::randint(0, 8, {12}, torch::kLong));
      EXPECT_TRUE(std::isfinite(loss)) << schedule::name(kind);
      const pipeline::StepTrace& t = pipe.last_trace();
      ASSERT_EQ(t.host_reads.size(), 3u);
      for (size_t s = 0; s < 3; ++s)
        EXPECT_EQ(t.host_reads[s], 0) << schedule::name(kind) << " recompute " << static_cast<int>(recompute) << " stage " << s;
      ++runs;
    }
  std::cout << "host reads: " << runs << " steps, none inside a list\n";
}

// pipeline.cuda_graphs where it cannot apply: the reason a stage gives before its first step.
TEST(CudaGraphs, RefusedWhereTheyCannotApply) {
  pipeline::PipelineOptions o;
  o.recompute = Recompute::Never;
  o.schedule = schedule::Kind::OneFOneB;
  const c10::Device gpu("cuda:0"), cpu(c10::kCPU);
  EXPECT_EQ(pipeline::cuda_graphs_refused(o, gpu), "");
  EXPECT_EQ(pipeline::cuda_graphs_refused(o, cpu), "a stage on cpu (graphs replay a GPU's kernels)");
  o.recompute = Recompute::ExceptLast;
  EXPECT_NE(pipeline::cuda_graphs_refused(o, gpu).find("recompute except_last"), std::string::npos);
  o.recompute = Recompute::Never;
  o.schedule = schedule::Kind::ZbH1;
  EXPECT_NE(pipeline::cuda_graphs_refused(o, gpu).find("zb-h1 splits the backward"), std::string::npos);
  o.schedule = schedule::Kind::GPipe;
  o.defer_weight_grads = true;
  EXPECT_EQ(pipeline::cuda_graphs_refused(o, gpu), "deferred weight gradients");
}

// The probe of a stage's first step: a layer a graph cannot replay (dropout's keyed masks) makes
// the stage say why and stay eager; without one, the second step would capture, and where no
// graphs exist for the device (the CPU) the stage says that instead and stays eager.
TEST(CudaGraphs, TheFirstStepFindsWhatAGraphCannotReplay) {
  // A random layer, none (the CPU stage's own refusal then), and BatchNorm, which merges its batch
  // statistics on the host (a replay would leave the running statistics where the capture left them).
  struct Case {
    torch::nn::AnyModule middle;
    bool found;  // by the first step's probe
    std::string said;
  };
  const std::vector<Case> cases = {
      {torch::nn::AnyModule(models::Dropout(0.5, 7)), true, "runs eagerly: a random layer (dropout)"},
      {torch::nn::AnyModule(models::Dropout(0.0, 7)), false, "runs eagerly: no CUDA graphs for a stage on cpu"},
      {torch::nn::AnyModule(models::BatchNorm(8)), true, "runs eagerly: BatchNorm merges its batch statistics on the host"}};
  for (const Case& c : cases) {
    torch::manual_seed(0);
    torch::nn::Sequential layers(torch::nn::Linear(4, 8));
    layers->push_back(c.middle.clone());
    layers->push_back(torch::nn::Linear(8, 3));
    stages::Stage st(0, 1, layers, Recompute::Never);
    st.set_loss([](const at::Tensor& out, const at::Tensor& y) { return torch::nn::functional::cross_entropy(out, y); });
    st.use_cuda_graphs("");
    testing::internal::CaptureStderr();
    for (int step = 0; step < 2; ++step) {
      st.begin_step(1, step, 1);
      st.forward(0, torch::randn({6, 4}), 0, torch::randint(0, 3, {6}, torch::kLong));
      st.backward(0, {});
      EXPECT_EQ(st.graphed_forwards(), 0);
      if (step == 0) EXPECT_EQ(st.graphs_refused().empty(), !c.found) << st.graphs_refused();
    }
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("stage 0: pipeline.cuda_graphs: " + c.said), std::string::npos) << err;
    EXPECT_EQ(err.find("pipeline.cuda_graphs", err.find("pipeline.cuda_graphs") + 1), std::string::npos) << "said twice: " << err;
  }
}

// A CPU pipeline asked for graphs trains as without them, each stage saying once why it is eager.
TEST(CudaGraphs, ACpuPipelineRunsEagerlyAndSaysSo) {
  std::vector<double> losses[2];
  std::string err;
  for (const bool graphs : {false, true}) {
    torch::manual_seed(0);
    torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
    pipeline::PipelineOptions o;
    o.stages = 2;
    o.micro_batches = 2;
    o.cuda_graphs = graphs;
    if (graphs) testing::internal::CaptureStderr();
    pipeline::Pipeline pipe(model, o, [](const at::Tensor& out, const at::Tensor& y) {
      return torch::nn::functional::cross_entropy(out, y);
    });
    pipe.optimizers().set([](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1)); });
    torch::manual_seed(1);
    for (int step = 0; step < 3; ++step) {
      losses[graphs].push_back(pipe.train_step(torch::randn({8, 8}), torch::randint(0, 4, {8}, torch::kLong)));
      EXPECT_EQ(pipe.last_trace().graphed, std::vector<int>({0, 0}));
    }
    if (graphs) err = testing::internal::GetCapturedStderr();
  }
  EXPECT_EQ(losses[0], losses[1]);
  for (const char* stage : {"stage 0", "stage 1"})
    EXPECT_NE(err.find(std::string(stage) + ": pipeline.cuda_graphs: runs eagerly: a stage on cpu"), std::string::npos) << err;
}

// The fused optimizers (job/fused_optimizers.h) against libtorch's loop: the same parameters and
// state after 5 steps of the same gradients, to rounding, for every option that changes the
// update, in float64 and float32, with a parameter whose gradient is missing in one step.
TEST(FusedOptimizers, EqualLibtorchsLoop) {
  using Make = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>, bool fused)>;
  const std::vector<std::pair<std::string, Make>> kinds{
      {"sgd", [](auto p, bool f) -> std::unique_ptr<torch::optim::Optimizer> {
         auto o = torch::optim::SGDOptions(0.1);
         if (f) return std::make_unique<job::FusedSGD>(p, o);
         return std::make_unique<torch::optim::SGD>(p, o);
       }},
      {"sgd momentum nesterov decay", [](auto p, bool f) -> std::unique_ptr<torch::optim::Optimizer> {
         auto o = torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01);
         if (f) return std::make_unique<job::FusedSGD>(p, o);
         return std::make_unique<torch::optim::SGD>(p, o);
       }},
      {"sgd momentum dampening", [](auto p, bool f) -> std::unique_ptr<torch::optim::Optimizer> {
         auto o = torch::optim::SGDOptions(0.1).momentum(0.5).dampening(0.3);
         if (f) return std::make_unique<job::FusedSGD>(p, o);
         return std::make_unique<torch::optim::SGD>(p, o);
       }},
      {"adam decay", [](auto p, bool f) -> std::unique_ptr<torch::optim::Optimizer> {
         auto o = torch::optim::AdamOptions(0.01).betas({0.8, 0.95}).weight_decay(0.1);
         if (f) return std::make_unique<job::FusedAdam>(p, o);
         return std::make_unique<torch::optim::Adam>(p, o);
       }},
      {"adam amsgrad", [](auto p, bool f) -> std::unique_ptr<torch::optim::Optimizer> {
         auto o = torch::optim::AdamOptions(0.01).amsgrad(true);
         if (f) return std::make_unique<job::FusedAdam>(p, o);
         return std::make_unique<torch::optim::Adam>(p, o);
       }},
      {"adamw", [](auto p, bool f) -> std::unique_ptr<torch::optim::Optimizer> {
         auto o = torch::optim::AdamWOptions(0.01).weight_decay(0.1);
         if (f) return std::make_unique<job::FusedAdamW>(p, o);
         return std::make_unique<torch::optim::AdamW>(p, o);
       }}};
  for (const auto& [name, make] : kinds)
    for (const auto type : {torch::kDouble, torch::kFloat}) {
      torch::manual_seed(3);
      std::vector<at::Tensor> a, b;
      for (const auto& shape : std::vector<std::vector<int64_t>>{{7, 5}, {5}, {3, 2, 4}}) {
        a.push_back(torch::randn(shape, type).requires_grad_());
        b.push_back(a.back().detach().clone().requires_grad_());
      }
      auto loop = make(a, false), fused = make(b, true);
      for (int step = 0; step < 5; ++step)
        for (size_t i = 0; i < a.size(); ++i) {
          const bool skipped = step == 2 && i == 1;  // no gradient this step: left alone by both
          const at::Tensor g = torch::randn(a[i].sizes(), type);
          a[i].mutable_grad() = skipped ? at::Tensor() : g.clone();
          b[i].mutable_grad() = skipped ? at::Tensor() : g.clone();
          if (i + 1 == a.size()) {
            loop->step();
            fused->step();
          }
        }
      const double tol = type == torch::kDouble ? 1e-12 : 1e-5;
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_LE((a[i] - b[i]).abs().max().item<double>(), tol) << name << " " << type << " parameter " << i;
      EXPECT_EQ(loop->state().size(), fused->state().size()) << name;
      for (size_t i = 0; i < a.size(); ++i) {
        auto la = loop->state().find(a[i].unsafeGetTensorImpl()), fb = fused->state().find(b[i].unsafeGetTensorImpl());
        ASSERT_EQ(la == loop->state().end(), fb == fused->state().end()) << name;
        if (la == loop->state().end()) continue;
        if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(la->second.get())) {
          auto& t = dynamic_cast<torch::optim::AdamParamState&>(*fb->second);
          EXPECT_EQ(s->step(), t.step()) << name;
          EXPECT_LE((s->exp_avg_sq() - t.exp_avg_sq()).abs().max().item<double>(), tol) << name;
        } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(la->second.get())) {
          auto& t = dynamic_cast<torch::optim::AdamWParamState&>(*fb->second);
          EXPECT_EQ(w->step(), t.step()) << name;
          EXPECT_LE((w->exp_avg_sq() - t.exp_avg_sq()).abs().max().item<double>(), tol) << name;
        } else {
          auto& s2 = dynamic_cast<torch::optim::SGDParamState&>(*la->second);
          auto& t = dynamic_cast<torch::optim::SGDParamState&>(*fb->second);
          EXPECT_LE((s2.momentum_buffer() - t.momentum_buffer()).abs().max().item<double>(), tol) << name;
        }
      }
    }
}

// Chunked cross-entropy (job/cross_entropy.h) equals the plain one, loss and gradient, over
// chunks that do not divide the rows, in float64, float32 and bfloat16 (whose plain reference is
// the float32 loss of the same logits).
TEST(CrossEntropy, ChunkedEqualsThePlainLossAndGradient) {
  for (const auto type : {torch::kDouble, torch::kFloat, torch::kBFloat16}) {
    torch::manual_seed(11);
    const int64_t C = 5000;
    const at::Tensor base = torch::randn({3, 7, C}) * 3;
    const at::Tensor target = torch::randint(0, C, {3, 7});
    const at::Tensor a = base.to(type).requires_grad_(), b = base.to(type).requires_grad_();
    const at::Tensor chunked = job::chunked_cross_entropy(a, target, C * 8 * 4);  // 4 rows a chunk: 21 = 5 x 4 + 1
    const at::Tensor plain = torch::nn::functional::cross_entropy(
        b.to(type == torch::kBFloat16 ? torch::kFloat : type).reshape({-1, C}), target.reshape({-1}));
    chunked.backward();
    plain.backward();
    const double tol = type == torch::kDouble ? 1e-12 : type == torch::kFloat ? 1e-5 : 1e-2;
    EXPECT_LE(std::abs(chunked.item<double>() - plain.item<double>()), tol) << type;
    EXPECT_EQ(a.grad().scalar_type(), type);
    EXPECT_LE((a.grad().to(torch::kDouble) - b.grad().to(torch::kDouble)).abs().max().item<double>(), tol * 1e-2) << type;
  }
  // mean_cross_entropy takes it from kChunkedCrossEntropyClasses classes on.
  const at::Tensor logits = torch::randn({2, 4, job::kChunkedCrossEntropyClasses}, torch::kDouble);
  const at::Tensor target = torch::randint(0, job::kChunkedCrossEntropyClasses, {2, 4});
  EXPECT_NEAR(job::mean_cross_entropy(logits, target).item<double>(),
              torch::nn::functional::cross_entropy(logits.reshape({8, -1}), target.reshape({-1})).item<double>(), 1e-12);
}
