// `pipetrain export`: a checkpoint's parameters and buffers merged into one torch.load-readable
// file; with --initial, the model a config builds, before any step (its initial weights under
// train.seed), so that another program can start from the same weights. With --format hf, a model
// of the hf family is written as the Hugging Face directory it was built from
// (models/hf.h: config.json, model.safetensors or shards), which from_pretrained loads, LoRA
// adapters merged into its weights; with --format peft, its LoRA adapters alone as PEFT writes
// them (models/hf_lora.h).
#include <cstdio>

#include "apps/commands.h"
#include "apps/common_options.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/shard.h"
#include "common/atomic_file.h"
#include "job/job.h"
#include "models/hf.h"
#include "models/hf_lora.h"

namespace pipetrain::apps {

namespace {

class Export final : public Command {
 public:
  explicit Export(CLI::App& app)
      : Command(app.add_subcommand("export",
                                   "Write a checkpoint's merged weights as one torch.load-readable file")) {
    subcommand_
        ->add_option("checkpoint", checkpoint_,
                     "A checkpoint directory, or a checkpoint root (its latest); with --initial, a config")
        ->required();
    subcommand_->add_option("out", out_, "Output file (a dict of named tensors); with --format hf, a directory")->required();
    subcommand_->add_option("--format", format_, "torch: one torch.load-readable file; hf: a directory from_pretrained loads "
                                                 "(a model of family hf; LoRA adapters merged into its weights); peft: its LoRA "
                                                 "adapters alone, as PEFT writes them")
        ->check(CLI::IsMember({"torch", "hf", "peft"}));
    subcommand_->add_option("--max-shard-mb", shard_mb_, "--format hf: the largest safetensors file, in MiB (default 5000)")
        ->check(CLI::Range(1, 1 << 30));
    subcommand_->add_flag("--initial", initial_,
                          "Write the model the config builds, before any step (its initial weights under train.seed)");
    config_.add_set(subcommand_);
  }

  int run() override {
    if (format_ == "hf" || format_ == "peft") return export_hf();
    if (initial_) {
      config_.path = checkpoint_;
      const job::Config c = config_.load();
      const models::Model m = job::build_model(c);
      c10::Dict<std::string, at::Tensor> d;
      for (const auto& p : m.layers->named_parameters()) d.insert(p.key(), p.value().detach());
      for (const auto& b : m.layers->named_buffers()) d.insert(b.key(), b.value());
      const std::vector<char> bytes = checkpoint::save_tensor_dict(d);
      write_file_atomically(out_, bytes.data(), bytes.size());
      std::printf("exported %zu tensors of the initial model of %s to %s\n", d.size(), checkpoint_.c_str(), out_.c_str());
      return 0;
    }
    if (!config_.overrides.empty()) throw ConfigError("export: --set goes with --initial (a checkpoint is exported as saved)");
    const std::string dir = checkpoint::find_checkpoint(checkpoint_);
    const size_t n = checkpoint::export_checkpoint(dir, out_);
    std::printf("exported %zu tensors of %s to %s\n", n, dir.c_str(), out_.c_str());
    return 0;
  }

 private:
  int export_hf() {
    nlohmann::json model;
    std::map<std::string, at::Tensor> weights;
    std::string from;
    if (initial_) {
      config_.path = checkpoint_;
      const job::Config c = config_.load();
      model = c.model;
      if (model.value("family", "") == "hf") {
        const models::Model m = job::build_model(c);
        for (const auto& p : m.layers->named_parameters()) weights[p.key()] = p.value().detach();
        for (const auto& b : m.layers->named_buffers()) weights[b.key()] = b.value();  // DeepSeek-V3's router's bias
      }
      from = "the initial model of " + checkpoint_;
    } else {
      if (!config_.overrides.empty()) throw ConfigError("export: --set goes with --initial (a checkpoint is exported as saved)");
      from = checkpoint::find_checkpoint(checkpoint_);
      model = checkpoint::checkpoint_model(from);
      if (model.value("family", "") == "hf")
        for (auto& [name, t] : checkpoint::checkpoint_weights(from)) weights[name] = t;
    }
    if (model.value("family", "") != "hf" || !model.contains("path") || !model["path"].is_string())
      throw ConfigError("export --format " + format_ + ": " + from + " is a model of family '" + model.value("family", "") +
                        "'; --format " + format_ + " writes a model built from a Hugging Face directory (model.family \"hf\")");
    const std::string source = model["path"].get<std::string>();
    if (format_ == "peft") {
      const size_t n = models::save_peft(source, weights, model, out_);
      std::printf("exported %zu adapter tensors of %s to %s (PEFT, PeftModel.from_pretrained loads it over %s)\n", n, from.c_str(),
                  out_.c_str(), source.c_str());
      return 0;
    }
    models::merge_adapters(weights, model);  // LoRA's, into their projections' weights
    const size_t n = models::save_hf(source, weights, out_, uint64_t(shard_mb_) << 20);
    std::printf("exported %zu tensors of %s to %s (Hugging Face, from_pretrained loads it)\n", n, from.c_str(), out_.c_str());
    return 0;
  }

  std::string checkpoint_, out_, format_ = "torch";
  int64_t shard_mb_ = 5000;
  bool initial_ = false;
  ConfigOptions config_;
};

}  // namespace

std::unique_ptr<Command> add_export(CLI::App& app) { return std::make_unique<Export>(app); }

}  // namespace pipetrain::apps
