#include "models/generate.h"

#include <algorithm>
#include <cmath>

#include <torch/torch.h>

#include "common/error.h"
#include "models/incremental.h"
#include "models/skip.h"

namespace pipetrain::models {

namespace {

constexpr int64_t kBytes = 256;

void check_options(const GenerateOptions& o) {
  if (o.new_tokens < 0)
    throw ConfigError(detail::concat("generate: new_tokens must be >= 0, got ", o.new_tokens));
  if (o.seq_len < 1)
    throw ConfigError(
        detail::concat("generate: seq_len must be >= 1 (the model's model.seq_len), got ", o.seq_len));
  if (!std::isfinite(o.temperature) || o.temperature < 0)
    throw ConfigError(detail::concat("generate: temperature must be a finite number >= 0 (0: greedy), got ",
                                     o.temperature));
  if (o.top_k < 0)
    throw ConfigError(detail::concat("generate: top_k must be >= 0 (0: all tokens), got ", o.top_k));
  if (o.stop_id < -1)
    throw ConfigError(detail::concat("generate: stop_id must be a token id or -1 (none), got ", o.stop_id));
}

// What needs the vocabulary: top_k, stop_id and the prompt's ids.
void check_against_vocab(const GenerateOptions& o, const std::vector<int64_t>& prompt, int64_t vocab) {
  if (o.top_k > vocab)
    throw ConfigError(detail::concat("generate: top_k must be between 0 (all tokens) and the vocabulary's ",
                                     vocab, ", got ", o.top_k));
  if (o.stop_id >= vocab)
    throw ConfigError(
        detail::concat("generate: stop_id ", o.stop_id, " is not below the vocabulary's ", vocab));
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab)
      throw ConfigError(detail::concat("generate: the prompt's id ", i, " is ", prompt[i], ", not in [0, ",
                                       vocab, ") (the model's vocabulary)"));
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

at::Device device_of(const torch::nn::Sequential& model) {
  const auto params = model->parameters();
  return params.empty() ? at::Device(at::kCPU) : params.front().device();
}

// The model's logits of `ids`, checked to be [1, T, vocab]; `vocab` 0: any. `hint` ends the
// message of a mismatch.
at::Tensor checked_logits(const at::Tensor& logits, int64_t T, int64_t vocab, const std::string& hint) {
  if (logits.dim() != 3 || logits.size(0) != 1 || logits.size(1) != T || (vocab && logits.size(2) != vocab))
    throw ConfigError(detail::concat("generate: the model maps ", T, " token ids to logits of shape ",
                                     logits.sizes(), "; generation needs [1, ", T, ", ",
                                     vocab ? std::to_string(vocab) : "vocab", "]", hint));
  return logits;
}

// The model on a sequence that grows by a token at a time: the logits of the next token, on the
// last seq_len tokens, through the layers' KV caches where they all have one (the header says
// how the window slides), else by running the window.
class Context {
 public:
  Context(torch::nn::Sequential& model, const GenerateOptions& o, int64_t vocab, std::string hint)
      : model_(model), seq_len_(o.seq_len), vocab_(vocab), hint_(std::move(hint)), device_(device_of(model)) {
    if (o.cache && generates_incrementally(model))
      for (const auto& layer : model->children())
        layers_.push_back(dynamic_cast<IncrementalLayer*>(layer.get()));
    caches_.resize(layers_.size());
  }

  bool cached() const { return !layers_.empty(); }

  // The positions after seen_ (x) through every layer, extending the caches.
  at::Tensor through_caches(at::Tensor x) {
    TensorSkipScope scope;
    for (size_t i = 0; i < layers_.size(); ++i) x = layers_[i]->forward_at(x, seen_ - start_, caches_[i]);
    if (!scope.take().empty()) throw Error("generate: a skip is stashed but no later layer pops it");
    return x;
  }

  // [vocab] logits in float64 on the CPU; `ids`: the whole sequence so far (it only grows).
  at::Tensor next(const std::vector<int64_t>& ids) {
    const auto n = static_cast<int64_t>(ids.size());
    if (n - start_ > seq_len_) {  // the window is full: slide it, and start the caches again
      start_ = seen_ = n - seq_len_;
      caches_.assign(caches_.size(), KvCache{});
    }
    if (!cached()) start_ = seen_ = std::max<int64_t>(0, n - seq_len_);
    auto after = [&](int64_t from) {  // ids[from, n) as a batch of one
      return torch::from_blob(const_cast<int64_t*>(ids.data()) + from, {1, n - from}, torch::kLong).clone().to(device_);
    };
    int64_t T = n - seen_;
    at::Tensor x = after(seen_);
    if (cached()) {
      x = through_caches(x);
      if (std::any_of(caches_.begin(), caches_.end(), [](const KvCache& c) { return c.stale; })) {
        caches_.assign(caches_.size(), KvCache{});  // the kept positions are stale: the window again
        seen_ = start_;
        T = n - seen_;
        x = through_caches(after(seen_));
      }
      seen_ = n;
    } else {
      x = forward_with_skips(model_, x);
    }
    return checked_logits(x, T, vocab_, hint_)[0][T - 1].to(torch::kCPU, torch::kDouble);
  }

 private:
  torch::nn::Sequential& model_;
  int64_t seq_len_, vocab_;
  std::string hint_;
  at::Device device_;
  std::vector<IncrementalLayer*> layers_;  // empty: the window re-runs
  std::vector<KvCache> caches_;
  int64_t start_ = 0, seen_ = 0;  // ids[start_] is position 0; the caches hold ids[start_, seen_)
};

// The next token from the logits of the last position.
int64_t pick(at::Tensor logits, const GenerateOptions& o, at::Generator& gen) {
  if (o.temperature == 0) return logits.argmax().item<int64_t>();
  logits = logits / o.temperature;
  const int64_t vocab = logits.size(0);
  if (o.top_k > 0 && o.top_k < vocab) {
    // Keep exactly the k indices topk chose, so ties at the boundary do not let more through.
    auto keep = torch::zeros({vocab}, torch::kBool).index_fill_(0, std::get<1>(logits.topk(o.top_k)), true);
    logits = logits.masked_fill(keep.logical_not(), -INFINITY);
  }
  return torch::multinomial(torch::softmax(logits, 0), 1, /*replacement=*/false, gen).item<int64_t>();
}

std::vector<int64_t> run(torch::nn::Sequential& model, std::vector<int64_t> ids, const GenerateOptions& o,
                         int64_t vocab, const std::string& hint) {
  Context context(model, o, vocab, hint);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(o.new_tokens));
  const size_t prompt = ids.size();
  for (int64_t i = 0; i < o.new_tokens; ++i) {
    const int64_t next = pick(context.next(ids), o, gen);
    ids.push_back(next);
    if (next == o.stop_id) break;
  }
  return {ids.begin() + static_cast<std::ptrdiff_t>(prompt), ids.end()};
}

}  // namespace

bool generates_incrementally(const torch::nn::Sequential& model) {
  if (!model || model->is_empty()) return false;
  for (const auto& layer : model->children()) {
    const auto* l = dynamic_cast<const IncrementalLayer*>(layer.get());
    if (!l || !l->incremental()) return false;
  }
  return true;
}

std::vector<int64_t> generate_tokens(torch::nn::Sequential& model, const std::vector<int64_t>& prompt,
                                     const GenerateOptions& o) {
  check_options(o);
  if (!model) throw ConfigError("generate: no model");
  if (prompt.empty()) throw ConfigError("generate: the prompt needs at least one token id");
  torch::NoGradGuard no_grad;
  EvalMode eval(model);
  // The vocabulary, to check the ids against before they reach an embedding: one token's logits.
  const at::Tensor probe = forward_with_skips(
      model, torch::zeros({1, 1}, torch::TensorOptions(torch::kLong).device(device_of(model))));
  const int64_t vocab = checked_logits(probe, 1, 0, "").size(2);
  check_against_vocab(o, prompt, vocab);
  return run(model, prompt, o, vocab, "");
}

std::string generate(torch::nn::Sequential& model, const std::string& prompt, const GenerateOptions& o) {
  check_options(o);
  if (!model) throw ConfigError("generate: no model");
  std::vector<int64_t> ids;
  for (unsigned char ch : prompt.empty() ? std::string("\n") : prompt) ids.push_back(ch);
  check_against_vocab(o, ids, kBytes);
  torch::NoGradGuard no_grad;
  EvalMode eval(model);
  std::string out;
  for (int64_t b : run(model, ids, o, kBytes, " (a byte-level model: a gpt with model.vocab_size 256)"))
    out.push_back(static_cast<char>(static_cast<unsigned char>(b)));
  return out;
}

}  // namespace pipetrain::models
