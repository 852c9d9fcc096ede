// `pipetrain export`: a checkpoint's parameters and buffers merged into one torch.load-readable file.
#include <cstdio>

#include "apps/commands.h"
#include "checkpoint/checkpoint.h"

namespace pipetrain::apps {

namespace {

class Export final : public Command {
 public:
  explicit Export(CLI::App& app)
      : Command(app.add_subcommand("export",
                                   "Write a checkpoint's merged weights as one torch.load-readable file")) {
    subcommand_
        ->add_option("checkpoint", checkpoint_, "A checkpoint directory, or a checkpoint root (its latest)")
        ->required();
    subcommand_->add_option("out", out_, "Output file (a dict of named tensors)")->required();
  }

  int run() override {
    const std::string dir = checkpoint::find_checkpoint(checkpoint_);
    const size_t n = checkpoint::export_checkpoint(dir, out_);
    std::printf("exported %zu tensors of %s to %s\n", n, dir.c_str(), out_.c_str());
    return 0;
  }

 private:
  std::string checkpoint_, out_;
};

}  // namespace

std::unique_ptr<Command> add_export(CLI::App& app) { return std::make_unique<Export>(app); }

}  // namespace pipetrain::apps
