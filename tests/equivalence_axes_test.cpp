// The equivalence grid's other axes (the fixture and the step: equivalence.h and
// equivalence_test.cpp): the device contexts (the checking CPU context, which catches a missing
// wait, and every stage on one GPU), a transport that delivers in order, and data-parallel copies,
// the sharded optimizer and fp16.
#include "tests/equivalence.h"

namespace equivalence {

using namespace pipetrain;

namespace {


// The device contexts (stages/device.h). Checking: every schedule x the five runtime shapes
// (every family, skips across stages, a tie from the first stage to the last, every
// recomputation mode), as threads and as ranks over the local transport, in float64 on the CPU.
// CUDA: every schedule x those shapes x every recomputation mode, all stages on cuda:0, in
// float64 and (the plain shapes) float32.
std::vector<Case> device_cases(const std::string& device) {
  std::vector<Case> cases;
  for (Case c : runtime_cases()) {
    if (c.transport != "ucx" || c.ranks) continue;  // one of each shape per schedule
    c.transport = "local";
    c.device = device;
    if (device == "checking") {
      cases.push_back(c);
      c.ranks = true;
      cases.push_back(c);
      continue;
    }
    for (auto mode : kModes) {
      c.recompute = mode;
      c.dtype = torch::kDouble;
      cases.push_back(c);
      if (!schedule::uses_chunks(schedule::parse_kind(c.schedule)) && c.family != "unet") {
        c.dtype = torch::kFloat;
        cases.push_back(c);
      }
    }
    // Ranks on the GPU: one Pipeline per rank (threads here), every stage on cuda:0, over Gloo
    // (through pinned host memory) and over nccl-order (the c10d transport with NCCL's ordering;
    // its group is a CPU one, so the tensors cross through the host: NCCL's device path between
    // processes is gpu_processes_test's), for the tied GPT: its tie's gradients cross ranks.
    for (const std::string transport : {"gloo", "nccl-order"}) {
      if (c.family != "gpt_tied") break;  // the shape whose tie spans the first and the last rank
      Case r = c;
      r.ranks = true;
      r.transport = transport;
      r.dtype = torch::kDouble;
      cases.push_back(r);
    }
    // Data parallelism on the GPU: two copies of the pipeline on cuda:0, their gradients reduced
    // over Gloo (through the host), one SGD step against the single device's.
    if ((c.schedule == "gpipe" || c.schedule == "1f1b") && c.family != "gpt_tied") {
      c.copies = 2;
      c.recompute = Recompute::Never;
      c.dtype = torch::kDouble;
      cases.push_back(c);
    }
  }
  return cases;
}

// In-order delivery (comm/transport.h, schedule/in_order.h): every kind x the five runtime shapes
// where its lists hold under it (every shape but those of the V placements with more
// micro-batches than zb-v or more stages than dualpipev keep in order), as threads and as ranks.
std::vector<Case> in_order_cases() {
  std::vector<Case> cases;
  for (Case c : runtime_cases()) {
    if (c.transport != "ucx" || c.ranks) continue;
    const schedule::Kind kind = schedule::parse_kind(c.schedule);
    try {
      schedule::validate_in_order(schedule::make_schedule(kind, c.stages, c.micro_batches, schedule::chunks_for(kind)));
    } catch (const ScheduleError&) {
      continue;  // InOrderDelivery.VPlacementsAreRefusedNamingTheCrossing
    }
    c.transport = "local";
    c.in_order = true;
    cases.push_back(c);
    c.ranks = true;
    cases.push_back(c);
  }
  return cases;
}

// Data parallelism and fp16 in the same grid (a sample; data_parallel_test and precision_test
// run more steps and the ranks runtime): 2 copies of 2 stages (and 3 copies of 1), with and
// without the sharded optimizer, for a schedule of each family of kinds (fill-drain, 1F1B, split
// backward, interleaved, V), every model family (the tie with sharding too),
// float64; fp16 over three kinds and three families, against the micro-batch reference under the
// same autocast and loss scale.
std::vector<Case> stepped_cases() {
  std::vector<Case> cases;
  for (const std::string schedule : {"gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v"})
    for (const std::string family : {"mlp", "cnn", "gpt", "unet", "gpt_tied"})
      for (bool shard : {false, true}) {
        const bool chunked = schedule::uses_chunks(schedule::parse_kind(schedule));
        Case c{schedule, family, 2, chunked ? 4 : 3, Recompute::ExceptLast, torch::kDouble};
        c.batch = 14;  // 7 per copy: an uneven split into micro-batches
        c.copies = 2;
        c.shard = shard;
        cases.push_back(c);
      }
  for (bool shard : {false, true}) {
    Case c{"gpipe", "mlp", 1, 2, Recompute::Always, torch::kDouble};
    c.batch = 11;  // 4 + 4 + 3
    c.copies = 3;
    c.shard = shard;
    cases.push_back(c);
  }
  for (const std::string schedule : {"gpipe", "1f1b", "zb-h1"})
    for (const std::string family : {"mlp", "cnn", "gpt"}) {
      Case c{schedule, family, 2, 3, Recompute::ExceptLast, torch::kFloat};
      c.precision = Precision::FP16;
      cases.push_back(c);
    }
  return cases;
}

// Deferred weight gradients (models/weight_grads.h): every schedule x the five runtime shapes
// (their families: linear layers in the mlp, the gpt's attention and head, a layer list's; a tie;
// skips) x every recomputation mode, float64, as threads and as ranks; float32 on the plain
// shapes; and two data-parallel copies, sharded and not, where the flush comes before each
// chunk's reduction.
std::vector<Case> deferred_cases() {
  std::vector<Case> cases;
  for (Case c : runtime_cases()) {
    if (c.transport != "ucx" || c.ranks) continue;  // one of each shape per schedule
    c.transport = "local";
    c.defer = true;
    for (auto mode : kModes) {
      c.recompute = mode;
      c.dtype = torch::kDouble;
      c.ranks = mode == Recompute::ExceptLast;
      cases.push_back(c);
    }
    c.ranks = false;
    if (!schedule::uses_chunks(schedule::parse_kind(c.schedule)) && c.family != "unet") {
      c.dtype = torch::kFloat;
      cases.push_back(c);
    }
  }
  for (const std::string schedule : {"gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v"})
    for (bool shard : {false, true}) {
      const bool chunked = schedule::uses_chunks(schedule::parse_kind(schedule));
      Case c{schedule, "gpt", 2, chunked ? 4 : 3, Recompute::ExceptLast, torch::kDouble};
      c.batch = 14;
      c.copies = 2;
      c.shard = shard;
      c.defer = true;
      cases.push_back(c);
    }
  return cases;
}

// NCCL's ordering rules (the "nccl-order" transport, comm/c10d/nccl_order.h: the c10d transport
// with its data on a group that runs each rank's operations of a pair in posting order and hangs,
// here: fails naming the pair, when two sends or two receives meet): every schedule x 2, 3 and 4
// ranks x every recomputation mode, as threads and as ranks; and two data-parallel copies of a
// schedule of each family. Micro-batches: twice the stage count, so that 1F1B's steady state sends
// activations while gradients come back. With PIPETRAIN_TEST_SHARED_P2P_STREAM=1 both directions
// of a pair share one stream, as one NCCL communicator's point-to-point does: cases then deadlock
// whenever a send of each direction reach the heads together (a race, not every run).
std::vector<Case> nccl_order_cases() {
  std::vector<Case> cases;
  const std::pair<Recompute, const char*> modes[] = {
      {Recompute::Always, "gpt"}, {Recompute::ExceptLast, "mlp"}, {Recompute::Never, "gpt_tied"}};
  for (const std::string& schedule : schedule::kind_names())
    for (int k = 2; k <= 4; ++k)
      for (const auto& [mode, family] : modes)
        for (bool ranks : {false, true}) {
          Case c{schedule, family, k, 2 * k, mode, torch::kDouble, ranks, "nccl-order"};
          cases.push_back(c);
        }
  for (const std::string schedule : {"gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v"})
    for (int k = 2; k <= 3; ++k) {
      Case c{schedule, "gpt", k, 2 * k, Recompute::ExceptLast, torch::kDouble, false, "nccl-order"};
      c.batch = 14;
      c.copies = 2;
      cases.push_back(c);
    }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(NcclOrder, Equivalence, ::testing::ValuesIn(nccl_order_cases()), case_name);

INSTANTIATE_TEST_SUITE_P(Stepped, Equivalence, ::testing::ValuesIn(stepped_cases()), case_name);

INSTANTIATE_TEST_SUITE_P(Deferred, Equivalence, ::testing::ValuesIn(deferred_cases()), case_name);

INSTANTIATE_TEST_SUITE_P(InOrder, Equivalence, ::testing::ValuesIn(in_order_cases()), case_name);

// A V placement sends a neighbour activations and gradients in another order than it receives
// them: over a transport that delivers in order the pipeline refuses it at construction, naming
// the first message that would be taken for another.
TEST(InOrderDelivery, VPlacementsAreRefusedNamingTheCrossing) {
  for (const auto& [kind, stages, micro_batches] : {std::tuple{"zb-v", 2, 4}, std::tuple{"dualpipev", 3, 6}}) {
    models::Model m = build("mlp", torch::kDouble, true);
    pipeline::PipelineOptions o;
    o.schedule = schedule::parse_kind(kind);
    o.chunks = 2;
    o.stages = stages;
    o.micro_batches = micro_batches;
    o.transport.in_order = true;
    try {
      pipeline::Pipeline pipe(m.layers, o, pipetrain::test::mean_cross_entropy);
      ADD_FAILURE() << kind << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("a transport that delivers in order cannot run this schedule: schedule ") +
                                           kind + ": under in-order delivery stage"),
                std::string::npos)
          << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Checking, Equivalence, ::testing::ValuesIn(device_cases("checking")), case_name);
INSTANTIATE_TEST_SUITE_P(Cuda, Equivalence, ::testing::ValuesIn(device_cases("cuda")), case_name);

// The checking context catches a missing wait: the same step with any one of its waits left out
// (the k-th the stages make, whichever thread makes it) reads a tensor before its copy and ends
// in a NaN, a wrong gradient or an error, never in the reference's result.
TEST(CheckingContext, AMissingWaitCorruptsTheStep) {
  models::Model ref = build("mlp", torch::kDouble, false);
  const Batch b = make_batch(ref, 8, torch::kDouble);
  reference(ref, b, Precision::FP32);
  // 2 stages x 4 micro-batches: 4 inputs, 4 targets, 4 activations and 4 gradients, each waited for.
  for (int k = 0; k < 16; ++k) {
    models::Model m = build("mlp", torch::kDouble, false);
    pipeline::PipelineOptions o;
    o.stages = 2;
    o.micro_batches = 4;
    o.seed = 42;
    o.timeout_s = 60;
    o.checking_contexts = true;
    pipeline::Pipeline pipe(m.layers, o, pipetrain::test::mean_cross_entropy);
    stages::checking_contexts_skip_waits(1, k);
    bool equal = true;
    try {
      pipe.forward_backward(b.input, b.target);
      for (const auto& p : ref.layers->named_parameters()) {
        const at::Tensor g = m.layers->named_parameters()[p.key()].grad();
        equal = equal && g.defined() && g.isfinite().all().item<bool>() && pipetrain::test::rel_error(g, p.value().grad()) < 1e-10;
      }
    } catch (const std::exception&) {
      equal = false;  // e.g. a target read as -1
    }
    stages::checking_contexts_skip_waits(0);
    EXPECT_FALSE(equal) << "leaving out wait " << k << " did not change the step";
  }
  // And with every wait in place the same pipeline equals the reference.
  models::Model m = build("mlp", torch::kDouble, false);
  pipeline::PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 4;
  o.seed = 42;
  o.checking_contexts = true;
  pipeline::Pipeline pipe(m.layers, o, pipetrain::test::mean_cross_entropy);
  pipe.forward_backward(b.input, b.target);
  for (const auto& p : ref.layers->named_parameters())
    EXPECT_LE(pipetrain::test::rel_error(m.layers->named_parameters()[p.key()].grad(), p.value().grad()), 1e-10) << p.key();
}

// A context's stamps: on the CPU a stamp is the host time it was given; on the checking context
// (as on CUDA) it is read back from the context's own clock, relative to an origin, once the
// context has synchronized, whatever host time it was given.
TEST(CheckingContext, StampsReadTheContextsClock) {
  const auto cpu = stages::make_device_context(c10::Device(c10::kCPU));
  EXPECT_FALSE(cpu->times_device());
  EXPECT_EQ(stages::DeviceContext::resolve(cpu->stamp(100.0), cpu->stamp(5.0)), 5.0);
  const auto checking = stages::make_device_context(c10::Device(c10::kCPU), /*checking=*/true);
  EXPECT_TRUE(checking->times_device());
  const stages::Stamp origin = checking->stamp(100.0);
  const auto a = torch::randn({64, 64});
  (void)a.mm(a);
  const stages::Stamp p = checking->stamp(5.0);
  checking->synchronize();
  const double t = stages::DeviceContext::resolve(origin, p);
  EXPECT_GE(t, 100.0);
  EXPECT_LT(t, 160.0);
}

// A step on checking contexts reads its computes' spans from the stamps: each inside the step,
// in the order the stage ran them.
TEST(CheckingContext, TheTraceHoldsTheContextsTimes) {
  models::Model m = build("mlp", torch::kDouble, false);
  const Batch b = make_batch(m, 8, torch::kDouble);
  pipeline::PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 4;
  o.checking_contexts = true;
  pipeline::Pipeline pipe(m.layers, o, pipetrain::test::mean_cross_entropy);
  pipe.forward_backward(b.input, b.target);
  const auto& t = pipe.last_trace();
  ASSERT_EQ(t.spans.size(), 2u);
  for (const auto& stage : t.spans) {
    double last_end = 0;
    int computes = 0;
    for (const auto& sp : stage) {
      EXPECT_LE(sp.start, sp.end);
      EXPECT_LE(sp.end, t.wall);
      const bool compute = sp.op == schedule::Op::Forward || sp.op == schedule::Op::Backward;
      if (!compute) continue;
      ++computes;
      EXPECT_GE(sp.start, last_end);
      last_end = sp.end;
    }
    EXPECT_EQ(computes, 8);
  }
}

}  // namespace

}  // namespace equivalence
