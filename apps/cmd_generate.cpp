// `pipetrain generate`: what a language model writes after its prompt: token ids after token ids
// (--prompt-ids; an hf model, or any model of token ids), or text after text from a byte-level
// model (--prompt; vocab_size 256, not an hf model, whose ids are its tokenizer's).
#include <chrono>
#include <cstdio>
#include <sstream>

#include "apps/commands.h"
#include "apps/common_options.h"
#include "checkpoint/checkpoint.h"
#include "common/strings.h"
#include "job/job.h"
#include "models/generate.h"

namespace pipetrain::apps {

namespace {

// "1 2 3" (spaces or commas between) as ids.
std::vector<int64_t> parse_ids(const std::string& text) {
  std::string spaced = text;
  for (char& ch : spaced)
    if (ch == ',') ch = ' ';
  std::istringstream in(spaced);
  std::vector<int64_t> ids;
  std::string word;
  while (in >> word) {
    size_t used = 0;
    int64_t id = -1;
    try {
      id = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || word.size() > 18)
      throw ConfigError("generate: --prompt-ids takes token ids as integers (\"1 2 3\"), got '" +
                        word.substr(0, 40) + "'");
    ids.push_back(id);
  }
  if (ids.empty()) throw ConfigError("generate: --prompt-ids holds no token id (give them as \"1 2 3\")");
  return ids;
}

class Generate final : public Command {
 public:
  explicit Generate(CLI::App& app)
      : Command(app.add_subcommand(
            "generate", "Generate from a language model: token ids, or text from a byte-level model")) {
    CLI::App* s = subcommand_;
    config_.add_path(s, "JSON config file of the model");
    s->add_option(
        "--checkpoint", checkpoint_,
        "A checkpoint directory, or a checkpoint root (its latest); without it an hf model's own weights");
    config_.add_set(s);
    auto* text =
        s->add_option("--prompt", prompt_, "Text to continue, for a byte-level model (default: a newline)");
    s->add_option("--prompt-ids", prompt_ids_, "Token ids to continue, as \"1 2 3\"; the output is token ids")
        ->excludes(text);
    s->add_option("--tokens,--bytes", options_.new_tokens, "Tokens (bytes) to generate, at most")
        ->check(kPositive);
    s->add_option("--temperature", options_.temperature, "Sampling temperature; 0: greedy")
        ->check(kNonNegative);
    s->add_option("--top-k", options_.top_k, "Sample among the k most likely tokens; 0: all")
        ->check(kNonNegative);
    s->add_option("--seed", options_.seed, "Seed of the sampling");
    s->add_option("--stop-id", options_.stop_id, "Stop after generating this token id (an end-of-text id)")
        ->check(kNonNegative);
    s->add_flag("--no-cache", no_cache_, "Re-run the whole window for every token (no key/value cache)");
    s->add_flag("--timing", timing_, "Print the generation's speed to stderr");
  }

  int run() override {
    const job::Config config = config_.load();
    models::Model model = job::build_model(config);
    const std::string family = config.model.value("family", "");
    if (!checkpoint_.empty())
      checkpoint::load_weights(checkpoint::find_checkpoint(checkpoint_), config, model.layers, model.ties);
    else if (family != "hf")
      throw ConfigError("generate: --checkpoint is required for a model of family '" + family +
                        "' (only an hf model brings its weights)");
    models::widen_frozen(model);  // generation computes in float32, without autocast
    options_.seq_len = model.sample_shape.empty() ? 0 : model.sample_shape.back();
    options_.cache = !no_cache_;
    const bool bytes = model.token_input && model.classes == 256 && family != "hf";
    const auto start = std::chrono::steady_clock::now();
    int64_t made = 0;
    if (prompt_ids_.empty()) {
      if (!bytes)
        throw ConfigError(detail::concat(
            "generate: ",
            prompt_.empty() ? "this" : "--prompt is text, for a byte-level model (vocab_size 256); this",
            " model of family ", family, " has a vocabulary of ", model.classes,
            " token ids, not bytes: give the prompt as --prompt-ids \"1 2 3\""));
      const std::string text = models::generate(model.layers, prompt_, options_);
      made = static_cast<int64_t>(text.size());
      std::fwrite(prompt_.data(), 1, prompt_.size(), stdout);
      std::fwrite(text.data(), 1, text.size(), stdout);
    } else {
      if (!model.token_input)
        throw ConfigError("generate: --prompt-ids needs a model of token ids (model.input_dtype \"long\")");
      std::vector<int64_t> ids = parse_ids(prompt_ids_);
      const std::vector<int64_t> out = models::generate_tokens(model.layers, ids, options_);
      made = static_cast<int64_t>(out.size());
      ids.insert(ids.end(), out.begin(), out.end());
      std::vector<std::string> words;
      for (int64_t id : ids) words.push_back(std::to_string(id));
      std::fputs(join(words, " ").c_str(), stdout);
    }
    std::printf("\n");
    if (timing_) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const bool cached = options_.cache && models::generates_incrementally(model.layers);
      std::fprintf(stderr, "generated %lld tokens in %.3f s: %.1f tokens/s (%s)\n",
                   static_cast<long long>(made), s, s > 0 ? double(made) / s : 0.0,
                   cached ? "key/value cache" : "the window re-run per token");
    }
    return 0;
  }

 private:
  ConfigOptions config_;
  std::string checkpoint_, prompt_, prompt_ids_;
  bool no_cache_ = false, timing_ = false;
  models::GenerateOptions options_;
};

}  // namespace

std::unique_ptr<Command> add_generate(CLI::App& app) { return std::make_unique<Generate>(app); }

}  // namespace pipetrain::apps
