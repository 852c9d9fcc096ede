#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <torch/torch.h>

#include "common/error.h"
#include "models/generate.h"
#include "models/model.h"

using namespace pipetrain;
using namespace pipetrain::models;

namespace {

// A hand-built byte model: at every position the logits favour (first byte of the context + 1)
// most, with 2, and the byte after that next, with 1; every other byte has 0. The most likely
// next byte therefore depends on where the context window starts.
class FirstPlusOneImpl : public torch::nn::Module {
 public:
  torch::Tensor forward(const torch::Tensor& tokens) {
    ++calls;
    longest = std::max(longest, tokens.size(1));
    auto best = (tokens.select(1, 0) + 1) % 256;
    auto logits = torch::one_hot(best, 256).to(torch::kFloat) * 2 +
                  torch::one_hot((best + 1) % 256, 256).to(torch::kFloat);
    return logits.unsqueeze(1).expand({tokens.size(0), tokens.size(1), 256}).contiguous();
  }
  int64_t calls = 0, longest = 0;
};
TORCH_MODULE(FirstPlusOne);

// The model's most likely byte after `context`, computed apart from the code under test.
int expected_best(const std::string& text, int64_t seq_len) {
  const size_t start = text.size() > static_cast<size_t>(seq_len) ? text.size() - seq_len : 0;
  return (static_cast<unsigned char>(text[start]) + 1) % 256;
}

torch::nn::Sequential hand_model(FirstPlusOne& inner) {
  torch::nn::Sequential s;
  s->push_back(inner);
  return s;
}

torch::nn::Sequential tiny_gpt(int64_t seq_len, int64_t vocab = 256) {
  nlohmann::json j{{"family", "gpt"}, {"vocab_size", vocab}, {"seq_len", seq_len}, {"d_model", 16},
                   {"n_heads", 2},    {"n_layers", 1},       {"dropout", 0.1}};
  JsonReader r(j, "model", "t.json");
  return models::build(r, 7).layers;
}

GenerateOptions opts(int64_t new_tokens, int64_t seq_len, double temperature, int64_t top_k, uint64_t seed) {
  GenerateOptions o;
  o.new_tokens = new_tokens;
  o.seq_len = seq_len;
  o.temperature = temperature;
  o.top_k = top_k;
  o.seed = seed;
  return o;
}

}  // namespace

TEST(Generate, GreedyFollowsTheArgmaxOverTheLastSeqLenBytes) {
  FirstPlusOne inner;
  auto model = hand_model(inner);
  const int64_t seq_len = 3, n = 20;
  const std::string prompt = "abcdefg";
  const std::string out = generate(model, prompt, opts(n, seq_len, 0.0, 0, 0));
  ASSERT_EQ(static_cast<int64_t>(out.size()), n);
  std::string text = prompt;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(static_cast<unsigned char>(out[i]), expected_best(text, seq_len)) << "byte " << i;
    text.push_back(out[i]);
  }
  EXPECT_EQ(inner->calls, n);
  EXPECT_EQ(inner->longest, seq_len);  // never more context than the model has
}

TEST(Generate, EmptyPromptStartsFromANewline) {
  FirstPlusOne inner;
  auto model = hand_model(inner);
  const std::string out = generate(model, "", opts(1, 8, 0.0, 0, 0));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(static_cast<unsigned char>(out[0]), expected_best("\n", 8));
  EXPECT_EQ(generate(model, "", opts(0, 8, 0.0, 0, 0)), "");
}

TEST(Generate, TopKSamplesOnlyAmongTheKMostLikely) {
  FirstPlusOne inner;
  auto model = hand_model(inner);
  const int64_t seq_len = 4;
  const std::string prompt = "hello";
  const std::string out = generate(model, prompt, opts(200, seq_len, 5.0, 2, 3));
  std::string text = prompt;
  int second = 0;
  for (char ch : out) {
    const int best = expected_best(text, seq_len), got = static_cast<unsigned char>(ch);
    EXPECT_TRUE(got == best || got == (best + 1) % 256) << "byte " << got << " after best " << best;
    second += got != best;
    text.push_back(ch);
  }
  EXPECT_GT(second, 0);  // at a high temperature the second choice does come up
}

TEST(Generate, SameSeedSameBytesAndTopOneIsGreedy) {
  auto model = tiny_gpt(16);
  const std::string prompt = "The quick brown fox";
  const auto a = generate(model, prompt, opts(40, 16, 1.0, 0, 11));
  const auto b = generate(model, prompt, opts(40, 16, 1.0, 0, 11));
  const auto c = generate(model, prompt, opts(40, 16, 1.0, 0, 12));
  EXPECT_EQ(a.size(), 40u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  const auto greedy = generate(model, prompt, opts(40, 16, 0.0, 0, 0));
  EXPECT_EQ(generate(model, prompt, opts(40, 16, 0.7, 1, 5)), greedy);
  EXPECT_EQ(generate(model, prompt, opts(40, 16, 0.0, 0, 99)), greedy);  // greedy ignores the seed
}

TEST(Generate, RestoresTrainingModeAndKeepsNoGraph) {
  auto model = tiny_gpt(8);
  model->train();
  generate(model, "abc", opts(4, 8, 1.0, 0, 0));
  EXPECT_TRUE(model->is_training());
  for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
  model->eval();
  generate(model, "abc", opts(4, 8, 1.0, 0, 0));
  EXPECT_FALSE(model->is_training());
}

TEST(Generate, RefusesBadOptionsWithOneLineMessages) {
  auto model = tiny_gpt(8);
  auto message = [&](const GenerateOptions& o, torch::nn::Sequential m) {
    try {
      generate(m, "abc", o);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(opts(-1, 8, 1.0, 0, 0), model).find("new_tokens"), std::string::npos);
  EXPECT_NE(message(opts(4, 0, 1.0, 0, 0), model).find("seq_len"), std::string::npos);
  EXPECT_NE(message(opts(4, 8, -0.5, 0, 0), model).find("temperature"), std::string::npos);
  EXPECT_NE(message(opts(4, 8, std::numeric_limits<double>::quiet_NaN(), 0, 0), model).find("temperature"),
            std::string::npos);
  EXPECT_NE(message(opts(4, 8, 1.0, -1, 0), model).find("top_k"), std::string::npos);
  EXPECT_NE(message(opts(4, 8, 1.0, 257, 0), model).find("top_k"), std::string::npos);
  EXPECT_NE(message(opts(4, 8, 1.0, 0, 0), tiny_gpt(8, 300)).find("vocab_size 256"), std::string::npos);
  for (const auto& m :
       {message(opts(-1, 8, 1.0, 0, 0), model), message(opts(4, 8, 1.0, 0, 0), tiny_gpt(8, 300))})
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

// The gpt family is not built of layers that run on the next positions alone: every byte re-runs
// the window, with or without options.cache, and token ids go through the same path.
TEST(Generate, TheGptFamilyReRunsTheWindow) {
  auto model = tiny_gpt(8);
  EXPECT_FALSE(generates_incrementally(model));
  GenerateOptions cached = opts(20, 8, 0.0, 0, 0), uncached = cached;
  uncached.cache = false;
  const std::string prompt = "a longer prompt than the window";
  const std::string bytes = generate(model, prompt, cached);
  EXPECT_EQ(bytes, generate(model, prompt, uncached));
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  std::string from_ids;
  for (int64_t id : generate_tokens(model, ids, cached)) from_ids.push_back(static_cast<char>(id));
  EXPECT_EQ(from_ids, bytes);
}

TEST(Generate, StopsAfterTheStopId) {
  FirstPlusOne inner;
  auto model = hand_model(inner);
  GenerateOptions o = opts(20, 3, 0.0, 0, 0);
  const std::string all = generate(model, "abcdefg", o);
  o.stop_id = static_cast<unsigned char>(all[4]);
  const std::string stopped = generate(model, "abcdefg", o);
  EXPECT_EQ(stopped, all.substr(0, all.find(all[4]) + 1));
}

TEST(Generate, RefusesBadTokenIdsAndOptionsWithOneLineMessages) {
  auto model = tiny_gpt(8, 300);
  auto message = [&](const std::vector<int64_t>& prompt, const GenerateOptions& o) {
    try {
      generate_tokens(model, prompt, o);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const GenerateOptions good = opts(4, 8, 1.0, 0, 0);
  EXPECT_EQ(message({1, 2}, good), "");
  GenerateOptions top_k = good, stop = good, low_stop = good, window = good;
  top_k.top_k = 301;
  stop.stop_id = 300;
  low_stop.stop_id = -2;
  window.seq_len = 0;
  const std::vector<std::pair<std::string, std::string>> cases{
      {message({}, good), "at least one token id"},
      {message({1, 300}, good), "the prompt's id 1 is 300, not in [0, 300)"},
      {message({-1}, good), "the prompt's id 0 is -1"},
      {message({1}, top_k), "top_k must be between 0 (all tokens) and the vocabulary's 300, got 301"},
      {message({1}, stop), "stop_id 300 is not below the vocabulary's 300"},
      {message({1}, low_stop), "stop_id must be a token id or -1"},
      {message({1}, window), "seq_len must be >= 1"},
  };
  for (const auto& [got, want] : cases) {
    EXPECT_NE(got.find(want), std::string::npos) << got;
    EXPECT_EQ(got.find('\n'), std::string::npos) << got;
  }
}
