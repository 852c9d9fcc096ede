// `pipetrain partition`: the exact min-max partitioner on a cost file, as one JSON object.
#include <iostream>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "apps/common_options.h"
#include "common/error.h"
#include "partitioner/cost_file.h"
#include "partitioner/partition.h"

namespace pipetrain::apps {

namespace {

class Partition final : public Command {
 public:
  explicit Partition(CLI::App& app)
      : Command(app.add_subcommand("partition",
                                   "Split a cost file into stages exactly (min-max) and print JSON")) {
    CLI::App* s = subcommand_;
    s->add_option("--costs", costs_path_, "JSON array of per-layer costs")->required();
    s->add_option("--stages", stages_, "Number of stages")->required()->check(kPositive);
    s->add_option("--memory-limit", memory_limit_,
                  "Bytes each stage may hold (parameters x3 for gradient and momentum, plus saved "
                  "activations of one micro-batch)")
        ->check(kNonNegative);
    s->add_option("--speeds", speeds_, "Relative speed of each stage's device (one per stage)")
        ->delimiter(',');
  }

  int run() override {
    const auto costs = partitioner::load_costs(costs_path_);
    partitioner::Constraints k;
    if (!speeds_.empty() && static_cast<int>(speeds_.size()) != stages_)
      throw ConfigError("--speeds: " + std::to_string(speeds_.size()) + " speeds for " +
                        std::to_string(stages_) + " stages");
    if (!speeds_.empty() || memory_limit_ > 0) {
      k.devices.resize(stages_);
      for (int i = 0; i < stages_; ++i) {
        if (!speeds_.empty()) k.devices[i].speed = speeds_[i];
        k.devices[i].memory_limit = memory_limit_;
      }
    }
    const partitioner::Plan p = partitioner::min_max(costs, stages_, k);
    const nlohmann::json j{{"balance", p.balance},
                           {"bottleneck", p.bottleneck_ms},
                           {"stage_ms", p.stage_ms},
                           {"stage_bytes", p.stage_bytes}};
    std::cout << j.dump() << "\n";
    return 0;
  }

 private:
  std::string costs_path_;
  int stages_ = 0;
  int64_t memory_limit_ = 0;  // 0: no limit
  std::vector<double> speeds_;
};

}  // namespace

std::unique_ptr<Command> add_partition(CLI::App& app) { return std::make_unique<Partition>(app); }

}  // namespace pipetrain::apps
