// Embedding pipetrain in your own program: a 2-stage GPipe pipeline over your own
// torch::nn::Sequential, trained on a toy regression-as-classification task.
#include <cstdio>

#include <torch/torch.h>

#include "pipeline/pipeline.h"

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential model(
      {{"fc1", torch::nn::Linear(16, 64)}, {"act1", torch::nn::Functional(torch::relu)},
       {"fc2", torch::nn::Linear(64, 64)}, {"act2", torch::nn::Functional(torch::relu)},
       {"head", torch::nn::Linear(64, 4)}});

  pipetrain::pipeline::PipelineOptions options;
  options.stages = 2;
  options.micro_batches = 4;
  pipetrain::pipeline::Pipeline pipe(model, options, [](const at::Tensor& out, const at::Tensor& target) {
    return torch::nn::functional::cross_entropy(out, target);
  });
  pipe.optimizers().set([](std::vector<at::Tensor> params) {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  });

  // Labels: which quarter of the input holds the largest sum.
  auto x = torch::randn({256, 16});
  auto y = x.view({256, 4, 4}).sum(2).argmax(1);
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    auto idx = torch::randint(0, 256, {32}, torch::kLong);
    last = pipe.train_step(x.index_select(0, idx), y.index_select(0, idx));
    if (step == 0) first = last;
  }
  const double accuracy = pipe.predict(x).argmax(1).eq(y).to(torch::kDouble).mean().item<double>();
  std::printf("stages %d, balance [%d, %d]: loss %.3f -> %.3f, accuracy %.3f\n", pipe.stages(),
              pipe.balance()[0], pipe.balance()[1], first, last, accuracy);
  // The caller's model holds the trained weights: the stages share its modules.
  return last < first && accuracy > 0.5 ? 0 : 1;
}
