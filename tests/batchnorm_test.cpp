// Deferred BatchNorm: a BatchNorm's running statistics are updated once per step from everything
// it saw in that step, as one torch BatchNorm forward over the union would, whatever the stage
// count, schedule or recomputation mode. The training forward still normalises each micro-batch
// by its own statistics, so a BatchNorm behind another one sees inputs that depend on the
// micro-batch count; the first BatchNorm of a network does not, and its statistics (and a
// network's evaluation output when it has only that one) are the same for every micro-batch
// count. References are torch's own BatchNorm, in float64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "common/error.h"
#include "common/recompute.h"
#include "models/layers.h"
#include "models/model.h"
#include "job/config.h"
#include "pipeline/pipeline.h"
#include "job/single_device.h"
#include "train/trainer.h"
#include "stages/stage.h"
#include "tests/helpers.h"

using namespace pipetrain;
using namespace pipetrain::pipeline;
using namespace pipetrain::job;
using namespace pipetrain::train;

namespace {

constexpr int64_t kBatch = 16;

// Conv maps with BatchNorm over channels (2d) and a linear layer with BatchNorm over features
// (1d); with `one_norm` only the first BatchNorm. With `deferred` the BatchNorms are
// models::BatchNorm, otherwise torch's (the reference). Both draw the same weights: BatchNorm
// initialisation draws nothing from the generator.
torch::nn::Sequential net(bool deferred, bool one_norm = false) {
  torch::manual_seed(7);
  torch::nn::Sequential s;
  auto norm = [&](std::string name, int64_t c, bool image) {
    if (one_norm && name != "bn0")
      return;
    else if (deferred)
      s->push_back(std::move(name), models::BatchNorm(c));
    else if (image)
      s->push_back(std::move(name), torch::nn::BatchNorm2d(c));
    else
      s->push_back(std::move(name), torch::nn::BatchNorm1d(c));
  };
  s->push_back("conv0", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)));
  norm("bn0", 4, true);
  s->push_back("relu0", torch::nn::Functional(torch::relu));
  s->push_back("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 4, 3).padding(1)));
  norm("bn1", 4, true);
  s->push_back("relu1", torch::nn::Functional(torch::relu));
  s->push_back("flatten", torch::nn::Flatten());
  s->push_back("fc", torch::nn::Linear(4 * 6 * 6, 8));
  norm("bn2", 8, false);
  s->push_back("relu2", torch::nn::Functional(torch::relu));
  s->push_back("head", torch::nn::Linear(8, 3));
  s->to(torch::kDouble);
  return s;
}

struct Data {
  at::Tensor x, y;
};

// Inputs with a channel offset and scale, so running means and variances move far from 0 and 1.
Data batch(int seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
  at::Tensor x = torch::randn({kBatch, 3, 6, 6}, gen, torch::kDouble) * 2.0 + 0.5;
  at::Tensor y = torch::randint(0, 3, {kBatch}, gen, torch::kLong);
  return {x, y};
}

// torch's model after training forwards on batches 1 and 2 split into `micro_batches`: each
// layer gets the micro-batches one by one, except that each BatchNorm updates its running
// statistics with one forward over all of them together (the output of that is discarded) and
// normalises each micro-batch by its own statistics. With one micro-batch this is plain torch on
// the whole batch. `eval_out`: the evaluation output on batch 3 afterwards.
struct Reference {
  torch::nn::Sequential model;
  at::Tensor eval_out;
};

const Reference& reference(int micro_batches, bool one_norm = false) {
  static std::map<std::pair<int, bool>, Reference> cache;
  auto it = cache.find({micro_batches, one_norm});
  if (it != cache.end()) return it->second;
  Reference r{net(false, one_norm), {}};
  torch::NoGradGuard no_grad;
  r.model->train();
  for (int seed : {1, 2}) {
    std::vector<at::Tensor> xs = batch(seed).x.tensor_split(micro_batches, 0);
    for (size_t i = 0; i < r.model->size(); ++i) {
      torch::nn::AnyModule& layer = *(r.model->begin() + i);
      if (r.model->named_children()[i].key().rfind("bn", 0) == 0) {
        layer.forward(torch::cat(xs));
        auto params = layer.ptr()->named_parameters();
        for (auto& x : xs)
          x = torch::batch_norm(x, params["weight"], params["bias"], {}, {}, /*training=*/true, 0.1, 1e-5, false);
      } else {
        for (auto& x : xs) x = layer.forward(x);
      }
    }
  }
  r.model->eval();
  r.eval_out = r.model->forward(batch(3).x);
  return cache.emplace(std::make_pair(micro_batches, one_norm), std::move(r)).first->second;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

// Every buffer (running_mean, running_var, num_batches_tracked) of `got` within `tol` of the
// one of the same name in `want`, and the same names on both sides.
::testing::AssertionResult same_statistics(const torch::nn::Module& got, const torch::nn::Module& want,
                                           double tol) {
  auto bg = got.named_buffers(), bw = want.named_buffers();
  if (bw.size() == 0) return ::testing::AssertionFailure() << "the reference has no buffers";
  if (bg.size() != bw.size())
    return ::testing::AssertionFailure() << bg.size() << " buffers against " << bw.size();
  for (const auto& b : bw) {
    const at::Tensor* other = bg.find(b.key());
    if (!other) return ::testing::AssertionFailure() << b.key() << " is missing";
    const double d = max_abs_diff(*other, b.value());
    if (!(d <= tol)) return ::testing::AssertionFailure() << b.key() << " differs by " << d;
  }
  return ::testing::AssertionSuccess();
}

std::vector<models::BatchNormImpl*> batch_norms(torch::nn::Module& m) {
  std::vector<models::BatchNormImpl*> found;
  for (const auto& child : m.modules(/*include_self=*/false))
    if (auto* bn = dynamic_cast<models::BatchNormImpl*>(child.get())) found.push_back(bn);
  return found;
}

PipelineOptions options(int stages, int micro_batches, const std::string& schedule, Recompute recompute) {
  PipelineOptions o;
  o.stages = stages;
  o.micro_batches = micro_batches;
  o.schedule = schedule::parse_kind(schedule);
  o.chunks = schedule::uses_chunks(schedule::parse_kind(schedule)) ? 2 : 1;
  o.recompute = recompute;
  o.timeout_s = 60;
  return o;
}

OptimizerFactory sgd(double lr) {
  return [lr](std::vector<at::Tensor> params) { return std::make_unique<torch::optim::SGD>(params, lr); };
}

}  // namespace

TEST(DeferredBatchNorm, SameWeightsAsTheReference) {
  EXPECT_TRUE(test::same_parameters(*net(true), *net(false)));
  EXPECT_TRUE(same_statistics(*net(true), *net(false), 0.0));
}

// ---- the layer alone ----------------------------------------------------------------------------

namespace {
// `theirs`: torch's BatchNorm of the input's rank, with momentum 0.2 and eps 1e-4.
template <typename TorchBatchNorm>
void expect_same_as_torch(TorchBatchNorm theirs, const std::vector<int64_t>& shape) {
  SCOPED_TRACE(::testing::Message() << "shape " << at::IntArrayRef(shape));
  {
    torch::manual_seed(3);
    at::Tensor x = torch::randn(shape, torch::kDouble) * 3 - 1;
    models::BatchNorm ours(5, 0.2, 1e-4);
    ours->to(torch::kDouble);
    theirs->to(torch::kDouble);
    {
      torch::NoGradGuard no_grad;
      ours->weight.uniform_(0.5, 1.5);
      ours->bias.uniform_(-1, 1);
      theirs->weight.copy_(ours->weight);
      theirs->bias.copy_(ours->bias);
    }
    at::Tensor a = ours(x), b = theirs(x);
    EXPECT_LE(max_abs_diff(a, b), 1e-12) << "training forward, shape " << x.sizes();
    // The forward accumulated but did not update.
    EXPECT_EQ(ours->pending_count(), x.numel() / 5);
    EXPECT_EQ(ours->running_mean.abs().sum().item<double>(), 0.0);
    EXPECT_EQ(ours->num_batches_tracked.item<int64_t>(), 0);
    ours->commit();
    EXPECT_EQ(ours->pending_count(), 0);
    EXPECT_EQ(ours->num_batches_tracked.item<int64_t>(), 1);
    EXPECT_TRUE(same_statistics(*ours, *theirs, 1e-13)) << x.sizes();
    ours->eval();
    theirs->eval();
    EXPECT_LE(max_abs_diff(ours(x), theirs(x)), 1e-12) << "evaluation forward, shape " << x.sizes();
    // Gradients of the training forward are torch's too.
    ours->train();
    theirs->train();
    at::Tensor xa = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
    at::Tensor w = torch::randn(shape, torch::kDouble);
    (ours(xa) * w).sum().backward();
    (theirs(xb) * w).sum().backward();
    EXPECT_LE(max_abs_diff(xa.grad(), xb.grad()), 1e-12);
    EXPECT_LE(max_abs_diff(ours->weight.grad(), theirs->weight.grad()), 1e-12);
    EXPECT_LE(max_abs_diff(ours->bias.grad(), theirs->bias.grad()), 1e-12);
  }
}
}  // namespace

TEST(DeferredBatchNorm, ForwardIsTorchsForwardAndCommitIsTorchsUpdate) {
  expect_same_as_torch(torch::nn::BatchNorm1d(torch::nn::BatchNormOptions(5).momentum(0.2).eps(1e-4)), {10, 5});
  expect_same_as_torch(torch::nn::BatchNorm1d(torch::nn::BatchNormOptions(5).momentum(0.2).eps(1e-4)), {4, 5, 7});
  expect_same_as_torch(torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(5).momentum(0.2).eps(1e-4)), {6, 5, 3, 4});
}

TEST(DeferredBatchNorm, PartsCommitLikeTheWholeAndResetDiscards) {
  torch::manual_seed(4);
  at::Tensor x = torch::randn({13, 3, 2, 2}, torch::kDouble) * 5 + 100;  // large mean, small spread
  models::BatchNorm whole(3), parts(3);
  whole->to(torch::kDouble);
  parts->to(torch::kDouble);
  whole(x);
  whole->commit();
  for (const auto& piece : x.tensor_split(std::vector<int64_t>{2, 7, 9}, 0)) parts(piece);  // sizes 2, 5, 2, 4
  parts(x.narrow(0, 0, 2) * 1000);  // discarded below
  parts->reset_accumulators();
  EXPECT_EQ(parts->pending_count(), 0);
  parts->commit();  // nothing to commit: nothing changes
  EXPECT_EQ(parts->num_batches_tracked.item<int64_t>(), 0);
  for (const auto& piece : x.tensor_split(std::vector<int64_t>{2, 7, 9}, 0)) parts(piece);
  EXPECT_EQ(parts->pending_count(), 13 * 4);
  parts->commit();
  EXPECT_TRUE(same_statistics(*parts, *whole, 1e-11));
}

TEST(DeferredBatchNorm, RecomputationDoesNotAccumulate) {
  models::BatchNorm bn(2);
  at::Tensor x = torch::randn({4, 2});
  {
    RecomputeGuard replay;
    EXPECT_TRUE(recomputing());
    bn(x);
  }
  EXPECT_FALSE(recomputing());
  EXPECT_EQ(bn->pending_count(), 0);
  bn(x);
  EXPECT_EQ(bn->pending_count(), 4);
}

TEST(DeferredBatchNorm, OneValuePerChannelIsRefusedInTraining) {
  models::BatchNorm bn(3);
  EXPECT_THROW(bn(torch::randn({1, 3})), c10::Error);
  EXPECT_EQ(bn->pending_count(), 0);
  bn(torch::randn({1, 3, 2}));  // two values per channel
  bn->eval();
  EXPECT_EQ(bn(torch::randn({1, 3})).sizes(), (std::vector<int64_t>{1, 3}));
}

// A recomputed micro-batch runs forward twice in a stage (once without gradients, once in
// backward); its statistics count once.
TEST(DeferredBatchNorm, StageRecomputationCountsEachMicroBatchOnce) {
  for (auto mode : {Recompute::Always, Recompute::Never}) {
    auto layers = net(true);
    stages::Stage st(0, 1, layers, mode);
    st.set_loss(pipetrain::test::mean_cross_entropy);
    st.begin_step(0, 0, 2);
    Data b = batch(1);
    auto bn0 = batch_norms(*layers).front();
    st.forward(0, b.x.narrow(0, 0, 4), 0, b.y.narrow(0, 0, 4), 0.25);
    EXPECT_EQ(bn0->pending_count(), 4 * 36) << recompute_name(mode);
    st.backward(0, {});
    EXPECT_EQ(bn0->pending_count(), 4 * 36) << recompute_name(mode);
    if (mode == Recompute::Always) {
      EXPECT_GT(st.last_recompute_s(), 0.0);  // it did recompute
    }
    EXPECT_FALSE(recomputing());
  }
}

// ---- in the pipeline --------------------------------------------------------------------------

using Case = std::tuple<std::string, int, int, Recompute>;  // schedule, stages, micro-batches, mode

class Deferred : public ::testing::TestWithParam<Case> {};

// Two steps (lr 0, so the weights stay those of the reference). With one BatchNorm, its running
// statistics and the evaluation output equal torch's BatchNorm on the two whole batches, for
// every micro-batch count. With three, every BatchNorm's statistics equal one torch BatchNorm
// forward over all the inputs it saw in the step (the micro-batch reference).
TEST_P(Deferred, StatisticsAreThoseOfTheWholeBatch) {
  const auto [schedule, stages, micro_batches, mode] = GetParam();
  for (bool one_norm : {true, false}) {
    SCOPED_TRACE(one_norm ? "one BatchNorm" : "three BatchNorms");
    auto model = net(true, one_norm);
    Pipeline pipe(model, options(stages, micro_batches, schedule, mode), pipetrain::test::mean_cross_entropy);
    pipe.optimizers().set(sgd(0.0));
    for (int s : {1, 2}) {
      Data b = batch(s);
      pipe.train_step(b.x, b.y);
    }
    const Reference& ref = reference(one_norm ? 1 : micro_batches, one_norm);
    EXPECT_TRUE(same_statistics(*model, *ref.model, 1e-10));
    for (auto* bn : batch_norms(*model)) {
      EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 2);
      EXPECT_EQ(bn->pending_count(), 0);
    }
    at::Tensor out = pipe.predict(batch(3).x);
    EXPECT_LE(max_abs_diff(out, ref.eval_out), 1e-10);
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto& [schedule, stages, mb, mode] = info.param;
  std::string kind = schedule;
  std::replace(kind.begin(), kind.end(), '-', '_');
  return kind + "_" + std::to_string(stages) + "stages_" + std::to_string(mb) + "mb_" + recompute_name(mode);
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (const std::string schedule : {"gpipe", "1f1b", "zb-h1", "interleaved-1f1b"})
    for (int stages : {1, 2})
      for (int mb : {1, 2, 3, 4, 8})  // 3 splits the batch of 16 unevenly
        for (auto mode : {Recompute::Never, Recompute::Always, Recompute::ExceptLast}) {
          if (schedule == "interleaved-1f1b" && mb % stages != 0) continue;
          all.emplace_back(schedule, stages, mb, mode);
        }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Pipeline, Deferred, ::testing::ValuesIn(cases()), case_name);

// The comparisons above are sensitive: torch's BatchNorm in the same pipeline updates its
// running statistics once per micro-batch, far from the whole-batch statistics.
TEST(DeferredBatchNorm, PerMicroBatchUpdatesWouldDiffer) {
  for (bool one_norm : {true, false}) {
    auto model = net(false, one_norm);
    Pipeline pipe(model, options(2, 4, "gpipe", Recompute::Never), pipetrain::test::mean_cross_entropy);
    for (int s : {1, 2}) {
      Data b = batch(s);
      pipe.forward_backward(b.x, b.y);
    }
    EXPECT_FALSE(same_statistics(*model, *reference(1, one_norm).model, 1e-3));
    EXPECT_FALSE(same_statistics(*model, *reference(4, one_norm).model, 1e-3));
  }
}

// What does depend on the micro-batch count: a BatchNorm behind another one sees inputs that the
// first normalised per micro-batch. The first BatchNorm's statistics are the whole batch's.
TEST(DeferredBatchNorm, LaterBatchNormsSeeMicroBatchNormalisedInputs) {
  auto model = net(true);
  Pipeline pipe(model, options(2, 4, "gpipe", Recompute::Never), pipetrain::test::mean_cross_entropy);
  for (int s : {1, 2}) {
    Data b = batch(s);
    pipe.forward_backward(b.x, b.y);
  }
  const auto got = model->named_buffers(), whole = reference(1).model->named_buffers();
  EXPECT_LE(max_abs_diff(got["bn0.running_mean"], whole["bn0.running_mean"]), 1e-10);
  EXPECT_LE(max_abs_diff(got["bn0.running_var"], whole["bn0.running_var"]), 1e-10);
  EXPECT_GT(max_abs_diff(got["bn1.running_mean"], whole["bn1.running_mean"]), 1e-6);
  EXPECT_TRUE(same_statistics(*model, *reference(4).model, 1e-10));
}

// Recomputing every micro-batch and recomputing none give the same statistics.
TEST(DeferredBatchNorm, RecomputeAlwaysEqualsNever) {
  auto always = net(true), never = net(true);
  Pipeline a(always, options(2, 4, "1f1b", Recompute::Always), pipetrain::test::mean_cross_entropy);
  Pipeline n(never, options(2, 4, "1f1b", Recompute::Never), pipetrain::test::mean_cross_entropy);
  for (int s : {1, 2}) {
    Data b = batch(s);
    a.forward_backward(b.x, b.y);
    n.forward_backward(b.x, b.y);
  }
  EXPECT_TRUE(same_statistics(*always, *never, 1e-13));
  EXPECT_TRUE(same_statistics(*always, *reference(4).model, 1e-10));
}

// With one micro-batch the pipeline step is the single-device step: loss, gradients and
// statistics, and both equal torch's BatchNorm.
TEST(DeferredBatchNorm, OneMicroBatchEqualsSingleDevice) {
  Data b = batch(1);
  auto pip = net(true);
  Pipeline pipe(pip, options(2, 1, "gpipe", Recompute::ExceptLast), pipetrain::test::mean_cross_entropy);
  const double loss = pipe.forward_backward(b.x, b.y);

  auto single = net(true);
  SingleDevice dev(single, pipetrain::test::mean_cross_entropy, sgd(0.0), 0);
  const double single_loss = dev.train_step(b.x, b.y);  // lr 0: the gradients stay in .grad

  auto torch_model = net(false);
  at::Tensor torch_loss = pipetrain::test::mean_cross_entropy(torch_model->forward(b.x), b.y);
  torch_loss.backward();

  EXPECT_LE(std::abs(loss - single_loss), 1e-12);
  EXPECT_LE(std::abs(loss - torch_loss.item<double>()), 1e-12);
  auto got = pip->named_parameters(), dev_params = single->named_parameters();
  for (const auto& p : torch_model->named_parameters()) {
    ASSERT_TRUE(got[p.key()].grad().defined()) << p.key();
    EXPECT_LE(max_abs_diff(got[p.key()].grad(), p.value().grad()), 1e-10) << p.key();
    EXPECT_LE(max_abs_diff(dev_params[p.key()].grad(), p.value().grad()), 1e-10) << p.key();
  }
  EXPECT_TRUE(same_statistics(*pip, *torch_model, 1e-12));
  EXPECT_TRUE(same_statistics(*single, *torch_model, 1e-12));
}

// With several micro-batches the training forward normalises each micro-batch by its own
// statistics (only the running statistics are deferred): the gradient is that of torch's
// BatchNorm applied to each micro-batch separately, weighted by its share of the batch.
TEST(DeferredBatchNorm, GradientsNormaliseEachMicroBatch) {
  Data b = batch(1);
  auto pip = net(true);
  Pipeline pipe(pip, options(2, 4, "1f1b", Recompute::ExceptLast), pipetrain::test::mean_cross_entropy);
  const double loss = pipe.forward_backward(b.x, b.y);

  auto torch_model = net(false);
  double want = 0;
  auto xs = b.x.tensor_split(4, 0), ys = b.y.tensor_split(4, 0);
  for (size_t m = 0; m < xs.size(); ++m) {
    at::Tensor l = pipetrain::test::mean_cross_entropy(torch_model->forward(xs[m]), ys[m]) * (static_cast<double>(xs[m].size(0)) / kBatch);
    l.backward();
    want += l.item<double>();
  }
  EXPECT_LE(std::abs(loss - want), 1e-12);
  auto got = pip->named_parameters();
  for (const auto& p : torch_model->named_parameters())
    EXPECT_LE(max_abs_diff(got[p.key()].grad(), p.value().grad()), 1e-10) << p.key();
}

// Gradient accumulation: every forward_backward commits its own batch.
TEST(DeferredBatchNorm, EachForwardBackwardCommits) {
  auto model = net(true);
  Pipeline pipe(model, options(2, 4, "gpipe", Recompute::ExceptLast), pipetrain::test::mean_cross_entropy);
  Data b1 = batch(1), b2 = batch(2);
  pipe.forward_backward(b1.x, b1.y, /*accumulate=*/false, 0.5);
  pipe.forward_backward(b2.x, b2.y, /*accumulate=*/true, 0.5);
  EXPECT_TRUE(same_statistics(*model, *reference(4).model, 1e-10));
}

// A step that fails anywhere changes no statistic, and leaves nothing behind for the next.
TEST(DeferredBatchNorm, FailedStepChangesNoStatistic) {
  auto fail_on_call = std::make_shared<int>(0);  // 0: never
  auto calls = std::make_shared<int>(0);
  stages::LossFn loss = [fail_on_call, calls](const at::Tensor& out, const at::Tensor& target) {
    if (++*calls == *fail_on_call) throw std::runtime_error("injected loss failure");
    return pipetrain::test::mean_cross_entropy(out, target);
  };
  auto model = net(true);
  Pipeline pipe(model, options(2, 4, "gpipe", Recompute::Never), loss);
  Data b1 = batch(1), b2 = batch(2);
  pipe.forward_backward(b1.x, b1.y);
  std::map<std::string, at::Tensor> before;
  for (const auto& buf : model->named_buffers()) before[buf.key()] = buf.value().clone();

  *calls = 0;
  *fail_on_call = 3;  // the last stage's third micro-batch: the first stage has run at least three
  EXPECT_THROW(pipe.forward_backward(b2.x, b2.y), std::exception);
  for (const auto& buf : model->named_buffers()) EXPECT_TRUE(torch::equal(buf.value(), before[buf.key()])) << buf.key();
  for (auto* bn : batch_norms(*model)) EXPECT_EQ(bn->pending_count(), 0);

  *fail_on_call = 0;
  pipe.forward_backward(b2.x, b2.y);  // as if the failed step had never run
  EXPECT_TRUE(same_statistics(*model, *reference(4).model, 1e-10));
}

// Training forwards run outside a step (profiling runs layers on their own) are discarded when
// the next step starts.
TEST(DeferredBatchNorm, ForwardsOutsideAStepAreDiscarded) {
  auto model = net(true);
  Pipeline pipe(model, options(2, 4, "1f1b", Recompute::ExceptLast), pipetrain::test::mean_cross_entropy);
  {
    torch::NoGradGuard no_grad;
    model->forward(batch(9).x);
  }
  ASSERT_GT(batch_norms(*model).front()->pending_count(), 0);
  for (int s : {1, 2}) {
    Data b = batch(s);
    pipe.forward_backward(b.x, b.y);
  }
  EXPECT_TRUE(same_statistics(*model, *reference(4).model, 1e-10));
}

// ---- the cnn family ---------------------------------------------------------------------------

TEST(DeferredBatchNorm, CnnConfigKey) {
  auto build = [](nlohmann::json cfg) {
    JsonReader r(cfg, "model", "test.json");
    return models::build(r, 0);
  };
  nlohmann::json cfg{{"family", "cnn"}, {"channels", 4}, {"hidden", 16}, {"image_size", 8}};
  models::Model plain = build(cfg);
  EXPECT_EQ(plain.layers->named_buffers().size(), 0u);
  EXPECT_NE(plain.layers->named_parameters().find("conv1.conv.bias"), nullptr);

  cfg["batch_norm"] = true;
  models::Model bn = build(cfg);
  EXPECT_EQ(models::layer_names(bn.layers), models::layer_names(plain.layers));
  auto buffers = bn.layers->named_buffers();
  for (const char* layer : {"conv1", "conv2", "conv3"})
    for (const char* name : {"running_mean", "running_var", "num_batches_tracked"})
      EXPECT_NE(buffers.find(std::string(layer) + ".bn." + name), nullptr) << layer << " " << name;
  EXPECT_EQ(bn.layers->named_parameters().find("conv1.conv.bias"), nullptr);  // cancelled by the norm

  cfg["batch_norm"] = "yes";
  try {
    build(cfg);
    FAIL() << "a string batch_norm was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.batch_norm"), std::string::npos) << e.what();
  }
}

// The cnn family with batch_norm trains through the whole trainer: the loss falls, every
// BatchNorm counts one batch per step, and the test evaluation runs on the running statistics.
TEST(DeferredBatchNorm, CnnWithBatchNormTrains) {
  nlohmann::json cfg{
      {"model", {{"family", "cnn"}, {"channels", 4}, {"hidden", 16}, {"batch_norm", true}, {"dropout", 0.0}}},
      {"data", {{"kind", "synthetic"}, {"batch_size", 16}, {"samples", 64}, {"test_samples", 64}}},
      {"pipeline", {{"stages", 2}, {"micro_batches", 4}}},
      {"optimizer", {{"kind", "adam"}, {"lr", 0.01}}},
      {"train", {{"steps", 30}}},
      {"runtime", {{"dtype", "float64"}}}};
  Job job = prepare(parse_config(cfg, "cfg.json"));
  TrainOptions o;
  TrainResult r = pipetrain::train::train(job, o);
  ASSERT_EQ(r.losses.size(), 30u);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) first += r.losses[i], last += r.losses[25 + i];
  EXPECT_LT(last, 0.8 * first) << "mean loss of the first 5 steps " << first / 5 << ", last 5 " << last / 5;
  auto norms = batch_norms(*job.model.layers);
  ASSERT_EQ(norms.size(), 3u);
  for (auto* bn : norms) {
    EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 30);
    EXPECT_GT(bn->running_mean.abs().sum().item<double>(), 0.0);
  }
  EXPECT_EQ(r.test_samples, 64);
  EXPECT_TRUE(std::isfinite(r.test_loss));
  EXPECT_GT(r.test_accuracy, 0.0);
}
