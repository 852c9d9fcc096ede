// Embedding pipetrain with layers of your own: a layer that stashes a skip and a later one that
// pops it (through models::stash and models::pop, declared with models::SkipDeclaring), and two
// layers that share one weight (PipelineOptions::ties), run as a 3-stage 1F1B pipeline and
// checked against one device running the whole batch with one shared tensor, in float64.
// tests/install_example.sh builds this program against the installed package with another
// compiler than the library's where it can: the skip context must be one object in the program
// whichever compiler built the layer that stashes. Exits non-zero, saying what differs, otherwise.
#include <cmath>
#include <cstdio>
#include <exception>

#include <torch/torch.h>

#include "models/model.h"
#include "models/skip.h"
#include "pipeline/pipeline.h"

namespace {

namespace models = pipetrain::models;
namespace pipeline = pipetrain::pipeline;

// Encodes its input and stashes the feature map for the decoder.
struct EncodeImpl : torch::nn::Cloneable<EncodeImpl>, models::SkipDeclaring {
  EncodeImpl() { reset(); }
  void reset() override { lin = register_module("lin", torch::nn::Linear(6, 8)); }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = torch::tanh(lin(x));
    models::stash("feature", h);
    return h;
  }
  std::vector<std::string> stashes() const override { return {"feature"}; }
  torch::nn::Linear lin{nullptr};
};
TORCH_MODULE(Encode);

// Adds the stashed feature map back before its own linear layer.
struct DecodeImpl : torch::nn::Cloneable<DecodeImpl>, models::SkipDeclaring {
  DecodeImpl() { reset(); }
  void reset() override { lin = register_module("lin", torch::nn::Linear(8, 8)); }
  at::Tensor forward(const at::Tensor& x) { return torch::tanh(lin(x + models::pop("feature"))); }
  std::vector<std::string> pops() const override { return {"feature"}; }
  torch::nn::Linear lin{nullptr};
};
TORCH_MODULE(Decode);

// Layer 1's weight and the decoder's (layer 3) are one weight: equal at the start.
torch::nn::Sequential build() {
  torch::manual_seed(7);
  torch::nn::Sequential s;
  s->push_back("enc", Encode());
  s->push_back("mid", torch::nn::Linear(8, 8));
  s->push_back("act", torch::nn::Functional(torch::tanh));
  s->push_back("dec", Decode());
  s->push_back("head", torch::nn::Linear(8, 3));
  s->to(torch::kDouble);
  torch::NoGradGuard no_grad;
  s[3]->named_parameters()["lin.weight"].copy_(s[1]->named_parameters()["weight"]);
  return s;
}
const std::vector<models::Tie> kTies = {{{1, "weight"}, {3, "lin.weight"}}};

at::Tensor loss_of(const at::Tensor& out, const at::Tensor& target) {
  return torch::nn::functional::cross_entropy(out, target);
}

std::unique_ptr<torch::optim::Optimizer> sgd(std::vector<at::Tensor> params) {
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
}

double rel_error(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).norm().item<double>() / std::max(want.norm().item<double>(), 1e-30);
}

constexpr int kSteps = 3;

}  // namespace

int main() {
  try {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
    std::vector<at::Tensor> xs, ys;
    for (int s = 0; s < kSteps; ++s) {
      xs.push_back(torch::randn({12, 6}, gen).to(torch::kDouble));
      ys.push_back(torch::randint(0, 3, {12}, gen, torch::kLong));
    }

    // One device, one shared weight: the tie's gradient is the sum of its two uses', the
    // optimizer steps the first member and the second takes its value.
    torch::nn::Sequential want = build();
    at::Tensor first = want[1]->named_parameters()["weight"], second = want[3]->named_parameters()["lin.weight"];
    std::vector<at::Tensor> stepped;
    for (const auto& p : want->parameters())
      if (!p.is_same(second)) stepped.push_back(p);
    auto opt = sgd(stepped);
    std::vector<double> want_losses;
    for (int s = 0; s < kSteps; ++s) {
      for (auto& p : want->parameters()) p.mutable_grad() = at::Tensor();
      at::Tensor l = loss_of(models::forward_with_skips(want, xs[s]), ys[s]);
      l.backward();
      want_losses.push_back(l.item<double>());
      torch::NoGradGuard no_grad;
      first.mutable_grad().add_(second.grad());
      opt->step();
      second.copy_(first);
    }

    torch::nn::Sequential got = build();
    pipeline::PipelineOptions options;
    options.stages = 3;
    options.micro_batches = 4;
    options.balance = {2, 2, 1};  // the skip crosses the first cut, the tie spans stages 0 and 1
    options.schedule = pipetrain::schedule::Kind::OneFOneB;
    options.ties = kTies;
    options.timeout_s = 60;
    pipeline::Pipeline pipe(got, options, loss_of);
    pipe.optimizers().set(sgd);
    int failures = 0;
    for (int s = 0; s < kSteps; ++s) {
      const double loss = pipe.train_step(xs[s], ys[s]);
      if (!(std::fabs(loss - want_losses[s]) <= 1e-10 * std::fabs(want_losses[s]))) {
        std::fprintf(stderr, "step %d: loss %.17g, one device %.17g\n", s, loss, want_losses[s]);
        ++failures;
      }
    }
    auto w = want->named_parameters();
    for (const auto& p : got->named_parameters()) {
      const double e = rel_error(p.value(), w[p.key()]);
      if (!(e < 1e-10)) {
        std::fprintf(stderr, "%s differs from one device's by %.3g (relative)\n", p.key().c_str(), e);
        ++failures;
      }
    }
    if (!torch::equal(got[1]->named_parameters()["weight"], got[3]->named_parameters()["lin.weight"])) {
      std::fprintf(stderr, "the tied weights differ\n");
      ++failures;
    }
    if (failures) {
      std::fprintf(stderr, "FAILED: %d differences from one device\n", failures);
      return 1;
    }
    std::printf("own skip layers and a tie on %d stages, %d steps: equal to one device (loss %.6f)\n", pipe.stages(),
                kSteps, want_losses.back());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAILED: %s\n", e.what());
    return 1;
  }
}
