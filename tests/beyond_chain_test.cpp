// Models that are not a plain chain: a weight tied across stages (a language model's token
// embedding and output head) stays one weight — its copies equal bit for bit on every stage and
// rank, the training equal to one device's with one shared tensor — and skip connections cross
// stage boundaries (declared by the layers, or by hand for a user's layers that do not declare
// them). The central equivalence test (equivalence_test.cpp) runs both families through every
// schedule and recomputation mode; this file checks what it does not: several optimizer steps,
// the ranks' copies, and the declarations and their errors.
#include <gtest/gtest.h>

#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include <torch/torch.h>

#include "comm/transport.h"
#include "common/error.h"
#include "common/rng.h"
#include "models/model.h"
#include "models/skip.h"
#include "partitioner/partition.h"
#include "pipeline/pipeline.h"
#include "tests/helpers.h"

using namespace pipetrain;
using nlohmann::json;

namespace {

models::Model build(const json& config) {
  JsonReader r(config, "model", "test");
  models::Model m = models::build(r, /*seed=*/3);
  m.layers->to(torch::kDouble);
  return m;
}

json tied_gpt() {
  return {{"family", "gpt"}, {"vocab_size", 13}, {"seq_len", 6}, {"d_model", 8}, {"n_heads", 2},
          {"n_layers", 2}, {"d_ff", 16}, {"dropout", 0.1}, {"tie_embeddings", true}};
}

std::pair<at::Tensor, at::Tensor> tokens(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {torch::randint(0, 13, {n, 6}, gen, torch::kLong), torch::randint(0, 13, {n, 6}, gen, torch::kLong)};
}

pipeline::OptimizerFactory adamw() {
  return [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  };
}

at::Tensor param(models::Model& m, const models::ParamRef& ref) {
  return m.layers->ptr(ref.layer)->named_parameters()[ref.name];
}

constexpr int kSteps = 3;

// One device with one shared weight: the tie's gradient is the sum of its uses', the optimizer
// steps the first member, and the second is the same tensor's value.
std::vector<double> reference(models::Model& m) {
  const models::Tie& tie = m.ties.at(0);
  at::Tensor first = param(m, tie[0]), second = param(m, tie[1]);
  std::vector<at::Tensor> stepped;
  for (const auto& p : m.layers->parameters())
    if (p.unsafeGetTensorImpl() != second.unsafeGetTensorImpl()) stepped.push_back(p);
  auto opt = adamw()(stepped);
  std::vector<double> losses;
  for (int s = 0; s < kSteps; ++s) {
    const auto [x, y] = tokens(8, 10 + s);
    for (auto& p : m.layers->parameters()) p.mutable_grad() = at::Tensor();
    at::Tensor l;
    {
      RngContextGuard rng(RngContext{0, s, 0});
      l = pipetrain::test::mean_cross_entropy(m.layers->forward(x), y);
    }
    l.backward();
    losses.push_back(l.item<double>());
    torch::NoGradGuard no_grad;
    first.mutable_grad().add_(second.grad());
    opt->step();
    second.copy_(first);
  }
  return losses;
}

pipeline::PipelineOptions options(const models::Model& m, int stages) {
  pipeline::PipelineOptions o;
  o.stages = stages;
  o.micro_batches = 2;
  o.schedule = schedule::parse_kind("1f1b");
  o.ties = m.ties;
  o.timeout_s = 60;
  return o;
}

// The embedding on the first of three stages, the head on the last: after three AdamW steps the
// two copies are equal bit for bit, and the model equals one device's with one shared weight.
TEST(TiedWeights, CopiesStayBitIdenticalAndEqualOneDevice) {
  models::Model want = build(tied_gpt()), got = build(tied_gpt());
  ASSERT_EQ(want.ties.size(), 1u);
  const std::vector<double> want_losses = reference(want);
  pipeline::Pipeline pipe(got.layers, options(got, 3), pipetrain::test::mean_cross_entropy);
  pipe.optimizers().set(adamw());
  for (int s = 0; s < kSteps; ++s) {
    const auto [x, y] = tokens(8, 10 + s);
    EXPECT_NEAR(pipe.train_step(x, y), want_losses[s], 1e-10 * want_losses[s]) << "step " << s;
  }
  const models::Tie& tie = got.ties[0];
  EXPECT_EQ(pipe.balance(), (partitioner::Balance{1, 2, 2}));  // the embedding on stage 0, the head on stage 2
  EXPECT_TRUE(torch::equal(param(got, tie[0]), param(got, tie[1]))) << "the tied copies differ";
  auto w = want.layers->named_parameters();
  for (const auto& p : got.layers->named_parameters())
    EXPECT_LT(pipetrain::test::rel_error(p.value(), w[p.key()]), 1e-10) << p.key();
  ASSERT_EQ(pipe.tied_names().size(), 1u);
  EXPECT_EQ(pipe.tied_names()[0], (std::pair<std::string, std::string>{"head.linear.weight", "embed.tok.weight"}));
}

// A rank's endpoint that notes every tensor it sends: which ranks a tie's gradients cross between.
class NotingSends : public comm::Transport {
 public:
  struct Sent {
    int dst;
    comm::Kind kind;
    int64_t numel;
  };
  explicit NotingSends(std::unique_ptr<comm::Transport> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend() const override { return inner_->backend(); }
  bool takes(const c10::Device& device) const override { return inner_->takes(device); }
  void send(int dst, const comm::MessageId& id, const at::Tensor& tensor) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      sent_.push_back({dst, id.kind, tensor.numel()});
    }
    inner_->send(dst, id, tensor);
  }
  at::Tensor recv(int src, const comm::MessageId& id, Deadline deadline) override { return inner_->recv(src, id, deadline); }
  void abort(const std::string& reason) override { inner_->abort(reason); }
  std::vector<Sent> sent() const {
    std::lock_guard<std::mutex> lock(mu_);
    return sent_;
  }

 private:
  std::unique_ptr<comm::Transport> inner_;
  mutable std::mutex mu_;
  std::vector<Sent> sent_;
};

// One Pipeline per rank (the processes code path, ranks as threads): rank 0 holds the embedding,
// rank 2 the head; after three steps their copies equal each other and the threads run's, bit
// for bit. The tie's gradients cross between ranks 0 and 2 alone, once each way a step, as
// gradient messages (device memory where the transport takes it), never through the control
// plane nor to rank 1.
TEST(TiedWeights, RanksHoldEqualCopies) {
  models::Model threads_model = build(tied_gpt());
  pipeline::Pipeline threads(threads_model.layers, options(threads_model, 3), pipetrain::test::mean_cross_entropy);
  threads.optimizers().set(adamw());
  std::vector<double> threads_losses;
  for (int s = 0; s < kSteps; ++s) {
    const auto [x, y] = tokens(8, 10 + s);
    threads_losses.push_back(threads.train_step(x, y));
  }
  std::vector<models::Model> models;
  for (int r = 0; r < 3; ++r) models.push_back(build(tied_gpt()));
  auto o = options(models[0], 3);
  auto group = comm::make_transport_group(o.transport, 3);
  std::vector<std::unique_ptr<comm::Transport>> endpoints;
  std::vector<NotingSends*> noted;
  for (auto& e : group) {
    auto n = std::make_unique<NotingSends>(std::move(e));
    noted.push_back(n.get());
    endpoints.push_back(std::move(n));
  }
  std::vector<std::vector<double>> losses(3);
  std::vector<std::vector<NotingSends::Sent>> sent(3);
  std::vector<std::exception_ptr> errors(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.emplace_back([&, r] {
      try {
        pipeline::Pipeline pipe(models[r].layers, o, pipetrain::test::mean_cross_entropy, std::move(endpoints[r]));
        pipe.optimizers().set(adamw());
        for (int s = 0; s < kSteps; ++s) {
          const auto [x, y] = tokens(8, 10 + s);
          losses[r].push_back(pipe.train_step(x, y));
        }
        sent[r] = noted[r]->sent();  // the Pipeline owns the endpoint
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 3; ++r) {
    if (errors[r]) std::rethrow_exception(errors[r]);
    EXPECT_EQ(losses[r], threads_losses) << "rank " << r;
  }
  const models::Tie& tie = models[0].ties[0];
  const at::Tensor embed = param(models[0], tie[0]);
  EXPECT_TRUE(torch::equal(embed, param(models[2], tie[1]))) << "rank 0's embedding and rank 2's head differ";
  EXPECT_TRUE(torch::equal(embed, param(threads_model, tie[0]))) << "ranks against threads";
  const int64_t tied = embed.numel();
  std::map<std::pair<int, int>, int> tie_messages;  // (from, to): gradient messages of the tie's size
  for (int r = 0; r < 3; ++r)
    for (const auto& m : sent[r]) {
      if (m.numel != tied) continue;
      EXPECT_NE(m.kind, comm::Kind::Control) << "rank " << r << " sent a tie-sized tensor to rank " << m.dst
                                             << " through the control plane";
      if (m.kind == comm::Kind::Grad) ++tie_messages[{r, m.dst}];
    }
  EXPECT_EQ(tie_messages, (std::map<std::pair<int, int>, int>{{{0, 2}, kSteps}, {{2, 0}, kSteps}}));
}

TEST(TiedWeights, BadTiesAreRefused) {
  models::Model m = build(tied_gpt());
  auto expect_error = [&](std::vector<models::Tie> ties, const std::string& part) {
    auto o = options(m, 2);
    o.ties = std::move(ties);
    try {
      pipeline::Pipeline pipe(m.layers, o, pipetrain::test::mean_cross_entropy);
      ADD_FAILURE() << "no error for " << part;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_error({{{0, "tok.weight"}}}, "a tie needs at least two parameters");
  expect_error({{{0, "tok.weight"}, {9, "w"}}}, "layer 9 outside the model's");
  expect_error({{{0, "tok.weight"}, {3, "nothing"}}}, "has no parameter 'nothing'");
  expect_error({{{0, "tok.weight"}, {0, "pos.weight"}}}, "embed.pos.weight is Double [6, 8]");
}

// A user's layers that stash and pop without declaring it.
struct PlainStashImpl : torch::nn::Cloneable<PlainStashImpl> {
  PlainStashImpl() { reset(); }
  void reset() override { lin = register_module("lin", torch::nn::Linear(4, 4)); }
  at::Tensor forward(const at::Tensor& x) {
    models::stash("mine", x);
    return torch::tanh(lin(x));
  }
  torch::nn::Linear lin{nullptr};
};
TORCH_MODULE(PlainStash);
struct PlainPopImpl : torch::nn::Cloneable<PlainPopImpl> {
  PlainPopImpl() { reset(); }
  void reset() override { lin = register_module("lin", torch::nn::Linear(4, 3)); }
  at::Tensor forward(const at::Tensor& x) { return lin(x + models::pop("mine")); }
  torch::nn::Linear lin{nullptr};
};
TORCH_MODULE(PlainPop);

torch::nn::Sequential user_model() {
  torch::manual_seed(1);
  torch::nn::Sequential s;
  s->push_back("stash", PlainStash());
  s->push_back("mid", torch::nn::Linear(4, 4));
  s->push_back("pop", PlainPop());
  s->to(torch::kDouble);
  return s;
}

// Undeclared, the skip is refused at the first cut it crosses, naming it; declared by hand
// (PipelineOptions::skips), it crosses both cuts and the step equals one device's.
TEST(Skips, AUsersUndeclaredSkipIsNamedAndADeclaredOneCrosses) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const at::Tensor x = torch::randn({6, 4}, gen).to(torch::kDouble), y = torch::randint(0, 3, {6}, gen, torch::kLong);
  pipeline::PipelineOptions o;
  o.stages = 3;
  o.micro_batches = 2;
  o.timeout_s = 60;
  {
    pipeline::Pipeline pipe(user_model(), o, pipetrain::test::mean_cross_entropy);
    try {
      pipe.forward_backward(x, y);
      ADD_FAILURE() << "an undeclared skip crossed a cut";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("1 skip crosses the cut after virtual stage 0 (mine) where the layer list declares none"),
                std::string::npos)
          << e.what();
    }
  }
  torch::nn::Sequential want = user_model(), got = user_model();
  at::Tensor l = pipetrain::test::mean_cross_entropy(models::forward_with_skips(want, x), y);
  l.backward();
  o.skips = {{"mine", 0, 2}};
  pipeline::Pipeline pipe(got, o, pipetrain::test::mean_cross_entropy);
  EXPECT_NEAR(pipe.forward_backward(x, y), l.item<double>(), 1e-12);
  auto w = want->named_parameters();
  for (const auto& p : got->named_parameters()) EXPECT_LT(pipetrain::test::rel_error(p.value().grad(), w[p.key()].grad()), 1e-10) << p.key();
  o.skips = {{"mine", 2, 1}};
  EXPECT_THROW(pipeline::Pipeline(user_model(), o, pipetrain::test::mean_cross_entropy), ConfigError);
}

// The U-Net's skips and the cuts they cross: on three stages of two layers "enc1" (layer 0 to
// layer 4) crosses both cuts, "enc2" (1 to 3) the first; a skip that nothing pops is refused.
TEST(Skips, TheUnetsSkipsCrossOneAndTwoCuts) {
  models::Model m = build({{"family", "unet"}, {"image_size", 8}, {"channels", 2}});
  const auto skips = models::skips_of(m.layers);
  ASSERT_EQ(skips.size(), 2u);
  EXPECT_EQ(skips[0].name, "enc1");
  EXPECT_EQ(skips[0].pop_layer, 4);
  const auto three = models::skips_crossing(skips, partitioner::offsets({2, 2, 2}));
  EXPECT_EQ(three[0], (std::vector<std::string>{"enc1", "enc2"}));
  EXPECT_EQ(three[1], (std::vector<std::string>{"enc1"}));
  EXPECT_TRUE(three[2].empty());
  torch::nn::Sequential open;
  open->push_back("a", models::Stash("left"));
  open->push_back("b", torch::nn::Linear(2, 2));
  try {
    models::skips_of(open);
    FAIL() << "a skip that nothing pops";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("skip 'left' is stashed by layer 0 but no later layer pops it"), std::string::npos)
        << e.what();
  }
}

}  // namespace
