// The central test: one pipeline step computes the same loss and the same gradient for every
// parameter as one device running the whole batch, for every model family (with dropout),
// schedule (gpipe, 1f1b, interleaved-1f1b with 2 chunks, zb-h1 with its split backward), stage
// count, micro-batch count (including uneven splits) and recomputation mode, with the stages as
// threads of one Pipeline over the in-process transport. A sample of those cases also runs on the
// other runtimes and transports: one Pipeline over UCX, and one Pipeline per rank (the code path
// of runtime.kind processes, the ranks as threads here) over each transport. The reference is
// the same single-device step for all of them.
//
// Tolerances: in float64 the only difference is summation order (micro-batch partial sums of
// the loss and of the gradients), so the norm-wise relative error stays near 1e-15; 1e-10
// leaves room for that and still catches any real mistake (a wrong micro-batch weight, a
// different dropout mask, a missing gradient contribution are all >= 1e-3). In float32 the
// same reordering costs up to ~1e-5 relative on these small models; 1e-4 is the bound.
//
// Mixed precision (bf16: float32 weights, the forward under autocast to bfloat16) has two
// references. A pipeline step must equal the same model run on one device micro-batch by
// micro-batch under the same autocast: the same products in the same dtype, so only the order in
// which the float32 gradients of the micro-batches are summed differs (bound kBf16Tight, on the
// loss and every gradient; measured up to ~1e-6). And it must stay within bfloat16's accuracy (8
// bits of mantissa) of the float32 step on the whole batch: the loss within kBf16LooseLoss
// (measured up to 3.2e-4) and the whole gradient, all parameters as one vector, within
// kBf16LooseGrad (measured up to 0.6% for the cnn and gpt). The mlp gets a wider bound: a ReLU
// whose input lies within bfloat16's rounding of zero switches off, and on this 10-sample model
// that moves the gradient of the layers below it by 8.7% (measured).
#include "tests/equivalence.h"

namespace equivalence {

using namespace pipetrain;

namespace {


// A Pipeline with the loss its step returned.
struct PipelineRun {
  std::unique_ptr<pipeline::Pipeline> pipe;
  double loss = 0;
};

// One Pipeline per rank, each on its own thread with its own endpoint of one transport group, as
// the processes of runtime.kind processes run it: every Pipeline call is collective, so the ranks
// construct and step at the same time. Every wait is bounded by options.timeout_s (a rank that
// fails in a step also aborts its endpoint, so its peers fail at once), so the joins are too. The
// pipelines are returned rather than destroyed in their threads: no rank closes its endpoint
// while a peer may still be receiving from it. Throws naming every rank that failed.
std::vector<PipelineRun> step_ranks(std::vector<models::Model>& copies, const pipeline::PipelineOptions& o,
                                    const Batch& b) {
  const int K = o.stages;
  auto endpoints = comm::make_transport_group(o.transport, K);
  std::vector<PipelineRun> runs(K);
  std::vector<std::exception_ptr> errors(K);
  std::vector<std::thread> threads;
  for (int r = 0; r < K; ++r)
    threads.emplace_back([&, r] {
      try {
        runs[r].pipe = std::make_unique<pipeline::Pipeline>(copies[r].layers, o, pipetrain::test::mean_cross_entropy, std::move(endpoints[r]));
        runs[r].loss = runs[r].pipe->forward_backward(b.input, b.target);
        runs[r].pipe->optimizers().step();  // no optimizer: sums tied gradients, steps nothing
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  std::string failed;
  for (int r = 0; r < K; ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      failed += "rank " + std::to_string(r) + ": " + e.what() + "\n";
    } catch (...) {
      failed += "rank " + std::to_string(r) + ": an exception of unknown type\n";
    }
  }
  if (!failed.empty()) throw std::runtime_error(failed);
  return runs;
}


constexpr double kBf16Tight = 1e-5;      // against the bf16 micro-batch-by-micro-batch reference
constexpr double kBf16LooseLoss = 2e-3;  // against the float32 whole-batch step
double bf16_loose_grad(const std::string& family) { return family == "mlp" ? 0.15 : 2e-2; }

TEST_P(Equivalence, PipelineStepEqualsSingleDeviceStep) {
  const Case& c = GetParam();
  if (!comm::has_transport_backend(c.transport))
    GTEST_SKIP() << "the " << c.transport << " transport is not compiled into this build";
  if (c.device == "cuda") {
    const auto acc = stages::accelerator_info();
    if (acc.gpus == 0) GTEST_SKIP() << "no CUDA device: " << acc.no_gpu_reason;
    // Deterministic kernels in true float32 (no TF32 in products or convolutions): the device
    // then differs from the CPU only in summation order.
    at::globalContext().setDeterministicAlgorithms(true, true);
    at::globalContext().setAllowTF32CuBLAS(false);
    at::globalContext().setAllowTF32CuDNN(false);
  }
  const bool reduced = c.precision != Precision::FP32;
  const double tol = reduced ? kBf16Tight : c.dtype == torch::kDouble ? 1e-10 : 1e-4;
  const int64_t batch = c.batch;  // 10: 3 and 8 micro-batches split it unevenly
  const int chunks = schedule::uses_chunks(schedule::parse_kind(c.schedule)) ? 2 : 1;
  const bool deep = chunks > 1;

  // Reference: the whole batch on one device.
  models::Model ref = build(c.family, c.dtype, deep);
  Batch b = make_batch(ref, batch, c.dtype);
  // With batch norm each micro-batch is normalised by its own statistics (as GPipe does): the
  // reference then runs the micro-batches one after another.
  const bool batch_norm = family_config(c.family).dump().find("batchnorm") != std::string::npos;
  const double ref_loss = reference(ref, b, Precision::FP32, batch_norm ? c.micro_batches : 1);
  // Dropout is active: the test means nothing if it dropped nothing.
  ASSERT_TRUE(has_dropout(family_config(c.family)));
  // A reduced precision: the float32 whole-batch step above is the loose reference; the tight one
  // runs the micro-batches under autocast.
  models::Model tight = build(c.family, c.dtype, deep);
  constexpr double kFp16Scale = 4096;  // fp16's initial loss scale here, given to the reference too
  const double scale = c.precision == Precision::FP16 ? kFp16Scale : 1.0;
  const double tight_loss = reduced ? reference(tight, b, c.precision, c.micro_batches, scale) : 0.0;
  const double want_loss = reduced ? tight_loss : ref_loss;

  pipeline::PipelineOptions o;
  o.schedule = schedule::parse_kind(c.schedule);
  o.chunks = chunks;
  o.stages = c.stages;
  o.micro_batches = c.micro_batches;
  o.recompute = c.recompute;
  o.seed = 42;
  o.precision = c.precision;
  o.timeout_s = 60;
  o.transport.backend = pipetrain::comm::parse_backend(c.transport);
  o.ties = ref.ties;
  if (c.device == "cuda") o.devices = {c10::Device(c10::kCUDA, 0)};
  o.checking_contexts = c.device == "checking";
  o.transport.in_order = c.in_order;
  if (const char* shared = std::getenv("PIPETRAIN_TEST_SHARED_P2P_STREAM"))  // nccl_order_cases()
    o.transport.shared_p2p_stream = std::string(shared) == "1";
  o.data_parallel = c.copies;
  o.shard_optimizer = c.shard;
  o.defer_weight_grads = c.defer;
  o.defer_min_bytes = 0;  // these models' weights are all small: defer every one
  o.loss_scale.initial = scale;
  // A model copy per Pipeline, all equal to the reference's initial weights. Built here, one after
  // another: models::build seeds torch's global generator, which concurrent rank threads would share.
  std::vector<models::Model> copies;
  for (int r = 0; r < (c.ranks ? c.stages : 1); ++r) copies.push_back(build(c.family, c.dtype, deep));
  if (c.stepped()) {  // one optimizer step, SGD with lr 1: each parameter moves by minus its gradient
    ASSERT_FALSE(c.ranks) << "the ranks runtime of copies and fp16: data_parallel_test, precision_test";
    pipeline::Pipeline pipe(copies[0].layers, o, pipetrain::test::mean_cross_entropy);
    pipe.optimizers().set([](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 1.0); });
    std::map<std::string, at::Tensor> before;
    for (const auto& p : copies[0].layers->named_parameters()) before[p.key()] = p.value().detach().clone();
    const double loss = pipe.train_step(b.input, b.target);
    EXPECT_LE(std::abs(loss - want_loss), tol * std::abs(want_loss)) << "loss " << loss << " vs " << want_loss;
    EXPECT_FALSE(pipe.optimizers().last_step_skipped());
    const auto want = (reduced ? tight : ref).layers->named_parameters();
    const auto got = copies[0].layers->named_parameters();
    ASSERT_EQ(got.size(), want.size());
    for (const auto& p : want) {
      const at::Tensor moved = (before.at(p.key()) - got[p.key()].detach()).cpu();
      EXPECT_LE(pipetrain::test::rel_error(moved, p.value().grad() / scale), tol) << p.key();
    }
    return;
  }
  std::vector<PipelineRun> runs;
  if (c.ranks) {
    runs = step_ranks(copies, o, b);
  } else {
    runs.emplace_back();
    runs[0].pipe = std::make_unique<pipeline::Pipeline>(copies[0].layers, o, pipetrain::test::mean_cross_entropy);
    runs[0].loss = runs[0].pipe->forward_backward(b.input, b.target);
    runs[0].pipe->optimizers().step();  // no optimizer: sums tied gradients, steps nothing
  }

  // Every Pipeline, so every rank, returns the batch's loss.
  for (size_t r = 0; r < runs.size(); ++r) {
    if (c.batch < c.micro_batches) {
      EXPECT_LE(runs[r].pipe->fewest_micro_batches(), c.batch);
    }
    EXPECT_LE(std::abs(runs[r].loss - want_loss), tol * std::abs(want_loss))
        << "pipeline " << r << " loss " << runs[r].loss << " vs " << want_loss;
    if (reduced) {
      EXPECT_LE(std::abs(runs[r].loss - ref_loss), kBf16LooseLoss * std::abs(ref_loss))
          << "pipeline " << r << " loss " << runs[r].loss << " vs float32 " << ref_loss;
    }
  }
  // Each parameter's gradient from the Pipeline that runs its stage (the others hold it released);
  // every parameter must be run by exactly one.
  std::map<std::string, at::Tensor> grads;
  for (size_t r = 0; r < runs.size(); ++r)
    for (int vs = 0; vs < static_cast<int>(runs[r].pipe->balance().size()); ++vs) {
      if (!runs[r].pipe->is_local_stage(vs)) continue;
      for (const auto& p : runs[r].pipe->stage_layers(vs)->named_parameters())
        EXPECT_TRUE(grads.emplace(p.key(), p.value().grad().defined() ? p.value().grad().cpu() : at::Tensor()).second)
            << p.key() << " is run twice";
    }
  auto want = (reduced ? tight : ref).layers->named_parameters();
  auto loose = ref.layers->named_parameters();
  ASSERT_EQ(grads.size(), want.size());
  double diff_sq = 0, ref_sq = 0;  // the whole gradient against float32's
  for (const auto& p : want) {
    auto got = grads.find(p.key());
    ASSERT_NE(got, grads.end()) << p.key() << " is run by no stage";
    ASSERT_TRUE(got->second.defined()) << p.key() << " has no gradient";
    // Master weights: the gradients are of the parameters' dtype whatever the precision.
    EXPECT_EQ(got->second.scalar_type(), c.dtype) << p.key();
    EXPECT_LE(pipetrain::test::rel_error(got->second, p.value().grad()), tol) << p.key();
    if (reduced) {
      diff_sq += (got->second - loose[p.key()].grad()).pow(2).sum().item<double>();
      ref_sq += loose[p.key()].grad().pow(2).sum().item<double>();
    }
  }
  if (reduced) {
    EXPECT_LE(std::sqrt(diff_sq / ref_sq), bf16_loose_grad(c.family)) << "the whole gradient against float32's";
  }
}

}  // namespace

// The other runtimes, sampled: every schedule x {threads/ucx, ranks/local, ranks/ucx} x three
// shapes, in float64. The shapes between them cover every family and recomputation mode, an uneven
// split, fewer micro-batches than stages, and two to four ranks (interleaved: two chunks each,
// so a rank also sends to its own next chunk).
std::vector<Case> runtime_cases() {
  struct Shape {
    std::string family;
    int stages, micro_batches;
    Recompute recompute;
  };
  // The unet's skips cross ranks (on three stages, one crosses two); the tied gpt's tie spans the
  // first and the last rank.
  const std::vector<Shape> plain{{"mlp", 2, 3, Recompute::ExceptLast},
                                 {"gpt", 4, 8, Recompute::Always},
                                 {"cnn", 3, 2, Recompute::Never},
                                 {"unet", 3, 3, Recompute::ExceptLast},
                                 {"gpt_tied", 3, 4, Recompute::Always}};
  // Micro-batches a multiple of the stage count; the cnn's five layers make at most two stages.
  const std::vector<Shape> interleaved{{"mlp", 2, 4, Recompute::ExceptLast},
                                       {"gpt", 4, 4, Recompute::Always},
                                       {"cnn", 2, 2, Recompute::Never},
                                       {"unet", 3, 3, Recompute::Always},
                                       {"gpt_tied", 2, 4, Recompute::ExceptLast}};
  // V placement (two chunks, the turn on the last device, the loss on the first): at least 2K
  // micro-batches for dualpipev.
  const std::vector<Shape> v_shapes{{"mlp", 2, 4, Recompute::ExceptLast},
                                    {"gpt", 3, 7, Recompute::Always},
                                    {"cnn", 2, 5, Recompute::Never},
                                    {"unet", 3, 6, Recompute::ExceptLast},
                                    {"gpt_tied", 2, 4, Recompute::Never}};
  std::vector<Case> cases;
  for (const std::string& schedule : schedule::kind_names())
    for (const auto& [ranks, transport] :
         {std::pair{false, "ucx"}, std::pair{true, "local"}, std::pair{true, "ucx"}, std::pair{true, "gloo"}})
      for (const Shape& s : schedule::placement_of(schedule::parse_kind(schedule)) == schedule::Placement::V ? v_shapes
                            : schedule::uses_chunks(schedule::parse_kind(schedule))                          ? interleaved
                                                                                       : plain)
        cases.push_back({schedule, s.family, s.stages, s.micro_batches, s.recompute, torch::kDouble, ranks, transport});
  return cases;
}


// The threads/local grid keeps its plain names (the ctest entries select them by schedule and
// family); other runtimes lead with theirs, which those selections do not match.
std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string kind = c.schedule;
  std::replace(kind.begin(), kind.end(), '-', '_');
  std::string runtime = c.runtime() == "threads_local" ? "" : c.runtime() + "_";
  std::replace(runtime.begin(), runtime.end(), '-', '_');  // nccl-order
  return runtime + kind + "_" + c.family + "_" + std::to_string(c.stages) + "stages_" +
         std::to_string(c.micro_batches) + "mb_" + recompute_name(c.recompute) +
         (c.precision != Precision::FP32 ? std::string("_") + precision_name(c.precision)
                                         : c.dtype == torch::kDouble ? "_f64" : "_f32") +
         (c.batch != 10 ? "_batch" + std::to_string(c.batch) : "");
}

namespace {


// Every schedule x family x stage count 1-4 x recomputation mode. Micro-batches: 1, 2, 3 and 8
// (3 and 8 split the batch of 10 unevenly); interleaved-1f1b needs a multiple of the stage
// count, so it runs K and 2K; looped-bfs 3 and 2K; zb-v K and 2K+1; dualpipev, which needs at
// least 2K, 2K and 2K+1.
std::vector<Case> float64_cases() {
  std::vector<Case> cases;
  for (const std::string& schedule : schedule::kind_names())
    for (const std::string family : {"mlp", "cnn", "gpt", "unet", "gpt_tied"})
      for (int k = 1; k <= 4; ++k) {
        std::vector<int> mbs{1, 2, 3, 8};
        if (schedule::uses_chunks(schedule::parse_kind(schedule))) {
          if ((family == "cnn" && k > 2) || (family == "unet" && k > 3)) continue;
          mbs = {k, 2 * k};
          if (schedule == "looped-bfs") mbs = {3, 2 * k};
          if (schedule == "zb-v") mbs = {k, 2 * k + 1};
          if (schedule == "dualpipev") mbs = {2 * k, 2 * k + 1};  // needs M >= 2K
        }
        for (int m : mbs)
          for (auto mode : kModes) cases.push_back({schedule, family, k, m, mode, torch::kDouble});
      }
  return cases;
}

std::vector<Case> float32_cases() {
  std::vector<Case> cases;
  for (const std::string schedule : {"gpipe", "1f1b", "zb-h1"})
    for (const std::string family : {"mlp", "cnn", "gpt"})
      cases.push_back({schedule, family, 4, 3, Recompute::ExceptLast, torch::kFloat});
  for (const std::string family : {"mlp", "gpt"})
    cases.push_back({"interleaved-1f1b", family, 2, 4, Recompute::ExceptLast, torch::kFloat});
  return cases;
}


// bf16: every schedule x family x recomputation mode, on two shapes (an uneven split over three
// stages, and as many micro-batches as stages over two; interleaved: K and 2K micro-batches over two
// stages of two chunks), and a sample of the other runtimes, whose wire then carries bfloat16.
std::vector<Case> bf16_cases() {
  std::vector<Case> cases;
  for (const std::string schedule : {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1"})
    for (const std::string family : {"mlp", "cnn", "gpt"})
      for (auto mode : kModes) {
        std::vector<std::pair<int, int>> shapes{{3, 4}, {2, 2}};
        if (schedule::uses_chunks(schedule::parse_kind(schedule))) shapes = {{2, 2}, {2, 4}};
        for (auto [k, m] : shapes) {
          Case c{schedule, family, k, m, mode, torch::kFloat};
          c.precision = Precision::BF16;
          cases.push_back(c);
        }
      }
  for (const std::string schedule : {"1f1b", "zb-h1"})
    for (const auto& [ranks, transport] :
         {std::pair{false, "ucx"}, std::pair{true, "local"}, std::pair{true, "ucx"}, std::pair{true, "gloo"}}) {
      Case c{schedule, "gpt", 2, 3, Recompute::ExceptLast, torch::kFloat, ranks, transport};
      c.precision = Precision::BF16;
      cases.push_back(c);
    }
  return cases;
}

// An epoch's short last batch: fewer samples than micro-batches, so the step runs as fewer (one
// sample each, or as many as the kind allows): every schedule x family x recomputation mode on
// two stages, in float64. Interleaved kinds run the most micro-batches below the batch that the
// kind allows (interleaved-1f1b: a multiple of the stages).
std::vector<Case> partial_cases() {
  std::vector<Case> cases;
  for (const std::string& schedule : schedule::kind_names())
    for (const std::string family : {"mlp", "cnn", "gpt", "unet", "gpt_tied"})
      for (auto mode : kModes) {
        Case c{schedule, family, 2, 8, mode, torch::kDouble};
        c.batch = 5;
        if (schedule::uses_chunks(schedule::parse_kind(schedule))) c.micro_batches = 4, c.batch = 3;  // interleaved-1f1b runs 2
        if (schedule == "zb-v") c.micro_batches = 5;
        if (schedule == "dualpipev") c.micro_batches = 6, c.batch = 5;  // needs 2K = 4: runs 5
        cases.push_back(c);
      }
  return cases;
}

// Layer lists (model.family "layers"): a conv net with batch norm and a skip, a transformer stack
// with repeat, a llama_block with its dropout and a tied embedding; every schedule x recomputation
// mode, in float64.
std::vector<Case> layer_list_cases() {
  std::vector<Case> cases;
  for (const std::string& schedule : schedule::kind_names())
    for (const std::string family : {"listconv", "listgpt"})
      for (int k : {2, 3}) {
        std::vector<int> mbs{3};
        if (schedule::uses_chunks(schedule::parse_kind(schedule))) {
          if (k > 2) continue;
          mbs = {schedule == "looped-bfs" ? 3 : schedule == "zb-v" ? 2 * k + 1 : 2 * k};
        }
        for (int m : mbs)
          for (auto mode : kModes) cases.push_back({schedule, family, k, m, mode, torch::kDouble});
      }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Float64, Equivalence, ::testing::ValuesIn(float64_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(LayerLists, Equivalence, ::testing::ValuesIn(layer_list_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Partial, Equivalence, ::testing::ValuesIn(partial_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Bf16, Equivalence, ::testing::ValuesIn(bf16_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Float32, Equivalence, ::testing::ValuesIn(float32_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Runtimes, Equivalence, ::testing::ValuesIn(runtime_cases()), case_name);

}  // namespace

}  // namespace equivalence
