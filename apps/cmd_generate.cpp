// `pipetrain generate`: text sampled from a byte-level language model checkpoint, after its prompt.
#include <cstdio>

#include "apps/commands.h"
#include "apps/common_options.h"
#include "checkpoint/checkpoint.h"
#include "models/generate.h"
#include "job/job.h"

namespace pipetrain::apps {

namespace {

class Generate final : public Command {
 public:
  explicit Generate(CLI::App& app)
      : Command(app.add_subcommand("generate", "Sample text from a byte-level language model checkpoint")) {
    CLI::App* s = subcommand_;
    config_.add_path(s, "JSON config file of the model");
    s->add_option("--checkpoint", checkpoint_, "A checkpoint directory, or a checkpoint root (its latest)")
        ->required();
    config_.add_set(s);
    s->add_option("--prompt", prompt_, "Text to continue (default: a newline)");
    s->add_option("--bytes", options_.new_bytes, "Bytes to generate")->check(kPositive);
    s->add_option("--temperature", options_.temperature, "Sampling temperature; 0: greedy")
        ->check(kNonNegative);
    s->add_option("--top-k", options_.top_k, "Sample among the k most likely bytes; 0: all")
        ->check(kNonNegative);
    s->add_option("--seed", options_.seed, "Seed of the sampling");
  }

  int run() override {
    const train::Config config = config_.load();
    train::Job job = train::prepare(config);  // one process: no balance needed
    train::load_weights(train::find_checkpoint(checkpoint_), config, job.model.layers, job.model.ties);
    options_.seq_len = job.model.sample_shape.empty() ? 0 : job.model.sample_shape.back();
    const std::string text = models::generate(job.model.layers, prompt_, options_);
    std::fwrite(prompt_.data(), 1, prompt_.size(), stdout);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::printf("\n");
    return 0;
  }

 private:
  ConfigOptions config_;
  std::string checkpoint_, prompt_;
  models::GenerateOptions options_;
};

}  // namespace

std::unique_ptr<Command> add_generate(CLI::App& app) { return std::make_unique<Generate>(app); }

}  // namespace pipetrain::apps
