// `pipetrain export`: a checkpoint's parameters and buffers merged into one torch.load-readable
// file; with --initial, the model a config builds, before any step (its initial weights under
// train.seed), so that another program can start from the same weights.
#include <cstdio>

#include "apps/commands.h"
#include "apps/common_options.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/shard.h"
#include "common/atomic_file.h"
#include "job/job.h"

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
    subcommand_->add_option("out", out_, "Output file (a dict of named tensors)")->required();
    subcommand_->add_flag("--initial", initial_,
                          "Write the model the config builds, before any step (its initial weights under train.seed)");
    config_.add_set(subcommand_);
  }

  int run() override {
    if (initial_) {
      config_.path = checkpoint_;
      const train::Config c = config_.load();
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
  std::string checkpoint_, out_;
  bool initial_ = false;
  ConfigOptions config_;
};

}  // namespace

std::unique_ptr<Command> add_export(CLI::App& app) { return std::make_unique<Export>(app); }

}  // namespace pipetrain::apps
