// `pipetrain eval`: a checkpoint's loss and accuracy on the config's test split, forward only.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "apps/common_options.h"
#include "checkpoint/checkpoint.h"
#include "job/job.h"
#include "train/trainer.h"

namespace pipetrain::apps {

namespace {

class Eval final : public Command {
 public:
  explicit Eval(CLI::App& app)
      : Command(
            app.add_subcommand("eval", "Evaluate a checkpoint on the config's test split (forward only)")) {
    CLI::App* s = subcommand_;
    config_.add_path(s);
    s->add_option("--checkpoint", checkpoint_, "A checkpoint directory, or a checkpoint root (its latest)")
        ->required();
    config_.add_set(s);
    s->add_option("--batches", batches_, "Test batches to use (0: all; default train.eval_batches)")
        ->check(kNonNegative);
    s->add_flag("--json", json_, "Print the results as one JSON object");
  }

  int run() override {
    job::Config config = config_.load();
    ProgressLine progress = config_.progress(config);
    if (batches_ >= 0) config.train.eval_batches = batches_;
    job::Job job = job::prepare(config);
    const checkpoint::CheckpointState st =
        checkpoint::load_weights(checkpoint::find_checkpoint(checkpoint_), config, job.model.layers, job.model.ties);
    const train::TrainResult r =
        train::evaluate_model(job, [&](const std::string& text) { progress.note(text); });
    if (r.rank > 0) return 0;  // runtime.kind processes: rank 0 reports
    if (json_) {
      nlohmann::json j = train::test_results_json(r);
      j["checkpoint"] = st.dir;
      j["step"] = st.step;
      std::cout << j.dump() << "\n";
    } else {
      std::printf("%s (checkpoint %s, step %lld)\n", train::describe_test(r).c_str(), st.dir.c_str(),
                  static_cast<long long>(st.step));
    }
    return 0;
  }

 private:
  ConfigOptions config_;
  std::string checkpoint_;
  int64_t batches_ = -1;  // -1: train.eval_batches
  bool json_ = false;
};

}  // namespace

std::unique_ptr<Command> add_eval(CLI::App& app) { return std::make_unique<Eval>(app); }

}  // namespace pipetrain::apps
