#include "models/generate.h"

#include <cmath>
#include <vector>

#include <torch/torch.h>

#include "common/error.h"

namespace pipetrain::models {

namespace {

constexpr int64_t kBytes = 256;

void check_options(const GenerateOptions& o) {
  if (o.new_bytes < 0)
    throw ConfigError(detail::concat("generate: new_bytes must be >= 0, got ", o.new_bytes));
  if (o.seq_len < 1)
    throw ConfigError(
        detail::concat("generate: seq_len must be >= 1 (the model's model.seq_len), got ", o.seq_len));
  if (!std::isfinite(o.temperature) || o.temperature < 0)
    throw ConfigError(detail::concat("generate: temperature must be a finite number >= 0 (0: greedy), got ",
                                     o.temperature));
  if (o.top_k < 0 || o.top_k > kBytes)
    throw ConfigError(
        detail::concat("generate: top_k must be between 0 (all bytes) and ", kBytes, ", got ", o.top_k));
}

// Restores the model's training mode however generation ends.
class EvalMode {
 public:
  explicit EvalMode(torch::nn::Sequential& model) : model_(model), was_training_(model->is_training()) {
    model_->eval();
  }
  ~EvalMode() { model_->train(was_training_); }
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  torch::nn::Sequential& model_;
  bool was_training_;
};

// The next byte from the logits of the last position.
int64_t pick(at::Tensor logits, const GenerateOptions& o, at::Generator& gen) {
  if (o.temperature == 0) return logits.argmax().item<int64_t>();
  logits = logits / o.temperature;
  if (o.top_k > 0 && o.top_k < kBytes) {
    // Keep exactly the k indices topk chose, so ties at the boundary do not let more through.
    auto keep = torch::zeros({kBytes}, torch::kBool).index_fill_(0, std::get<1>(logits.topk(o.top_k)), true);
    logits = logits.masked_fill(keep.logical_not(), -INFINITY);
  }
  return torch::multinomial(torch::softmax(logits, 0), 1, /*replacement=*/false, gen).item<int64_t>();
}

}  // namespace

std::string generate(torch::nn::Sequential& model, const std::string& prompt, const GenerateOptions& o) {
  check_options(o);
  if (!model) throw ConfigError("generate: no model");
  torch::NoGradGuard no_grad;
  EvalMode eval(model);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);

  std::vector<int64_t> ids;
  for (unsigned char ch : prompt.empty() ? std::string("\n") : prompt) ids.push_back(ch);
  std::string out;
  out.reserve(static_cast<size_t>(o.new_bytes));
  for (int64_t i = 0; i < o.new_bytes; ++i) {
    const int64_t T = std::min<int64_t>(o.seq_len, static_cast<int64_t>(ids.size()));
    auto context = torch::from_blob(ids.data() + ids.size() - T, {1, T}, torch::kLong).clone();
    at::Tensor logits = model->forward(context);
    if (logits.dim() != 3 || logits.size(0) != 1 || logits.size(1) != T || logits.size(2) != kBytes)
      throw ConfigError(detail::concat(
          "generate: the model maps a context of ", T, " bytes to logits of shape ", logits.sizes(),
          "; byte generation needs [1, ", T, ", ", kBytes, "] (a gpt with model.vocab_size 256)"));
    const int64_t next = pick(logits[0][T - 1].to(torch::kDouble), o, gen);
    ids.push_back(next);
    out.push_back(static_cast<char>(static_cast<unsigned char>(next)));
  }
  return out;
}

}  // namespace pipetrain::models
