// `pipetrain costs transformer`: a cost file for hardware this machine does not have, from a
// decoder-only transformer's FLOP and byte counts.
#include <cstdio>
#include <iostream>
#include <sstream>

#include "apps/commands.h"
#include "apps/common_options.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "partitioner/cost_file.h"
#include "planner/whatif.h"

namespace pipetrain::apps {

namespace {

class Costs final : public Command {
 public:
  explicit Costs(CLI::App& app)
      : Command(app.add_subcommand("costs", "Write cost files for hardware this machine does not have")) {
    subcommand_->require_subcommand(1);
    CLI::App* t = subcommand_->add_subcommand(
        "transformer", "A decoder-only transformer's costs from its FLOP and byte counts");
    t->add_option("--layers", shape_.layers, "Transformer blocks")->required()->check(CLI::Range(1, 100000));
    t->add_option("--hidden", shape_.hidden, "Hidden size")->required()->check(CLI::Range(1, 1000000));
    t->add_option("--seq", shape_.seq, "Sequence length")->required()->check(CLI::Range(1, 10000000));
    t->add_option("--heads", shape_.heads, "Attention heads")->required()->check(CLI::Range(1, 100000));
    t->add_option("--vocab", shape_.vocab, "Vocabulary size")->required()->check(CLI::Range(1, 100000000));
    t->add_option("--micro-batch", shape_.micro_batch, "Sequences per micro-batch")
        ->required()
        ->check(CLI::Range(1, 1000000));
    t->add_option("--device-tflops", shape_.device_tflops, "Peak dense TFLOP/s of one device (default 400)")
        ->check(kPositive);
    t->add_option("--efficiency", shape_.efficiency, "Share of the peak reached (default 0.5)")
        ->check(CLI::Range(0.001, 1.0));
    t->add_option("--bandwidth", shape_.bandwidth_gb_s, "Link bandwidth between stages in GB/s (default 50)")
        ->check(kPositive);
    t->add_option("--latency-ms", shape_.latency_ms, "Link latency in ms (default 0.01)")
        ->check(kNonNegative);
    t->add_option("--bytes-per-value", shape_.bytes_per_value, "Bytes per activation value (default 2: bf16)")
        ->check(CLI::Range(1, 8));
    t->add_flag("--tie-embeddings", shape_.tie_embeddings, "The head tied to the token embedding (the file's ties)");
    t->add_option("--out", out_, "Write the cost file here (default: standard output)");
  }

  int run() override {
    const auto file = planner::transformer_costs(shape_);
    if (out_.empty()) {
      partitioner::write_cost_file(std::cout, file);
      return 0;
    }
    // A failed write leaves no half file (common/atomic_file.h).
    std::ostringstream text;
    partitioner::write_cost_file(text, file);
    try {
      write_file_atomically(out_, text.str());
    } catch (const IoError& e) {
      throw ConfigError("--out " + out_ + ": " + e.what());
    }
    std::printf("wrote %zu layers to %s\n", file.layers.size(), out_.c_str());
    return 0;
  }

 private:
  planner::TransformerShape shape_;
  std::string out_;
};

}  // namespace

std::unique_ptr<Command> add_costs(CLI::App& app) { return std::make_unique<Costs>(app); }

}  // namespace pipetrain::apps
