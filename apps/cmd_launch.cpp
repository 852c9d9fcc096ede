// `pipetrain launch`: N local ranks of a pipetrain subcommand or of any program (apps/launch.h).
#include <unistd.h>

#include "apps/commands.h"
#include "apps/common_options.h"
#include "apps/launch.h"

namespace pipetrain::apps {

namespace {

class Launch final : public Command {
 public:
  Launch(CLI::App& app, const char* program)
      : Command(app.add_subcommand("launch", "Start N local ranks of a command, like torchrun")),
        app_(app),
        program_(program) {
    CLI::App* s = subcommand_;
    s->add_option("--nproc", options_.nproc, "Ranks to start")->required()->check(CLI::Range(1, 4096));
    s->add_option("--master-addr", options_.master_addr, "MASTER_ADDR given to the ranks");
    s->add_option("--master-port", options_.master_port,
                  "MASTER_PORT given to the ranks (default: a free port)")
        ->check(CLI::Range(0, 65535));
    s->add_option("--grace", options_.grace_s, "Seconds the other ranks get to exit after one fails")
        ->check(kNonNegative);
    s->add_option("--max-restarts", options_.max_restarts,
                  "After a rank fails, start every rank again (a train command from its latest complete "
                  "checkpoint, adding --resume), up to this many times")
        ->check(CLI::Range(0, 1000));
    s->add_option("--min-nproc", options_.min_nproc,
                  "With --max-restarts: when the same rank fails first twice in a row, take its slot as gone "
                  "and restart on one rank fewer (a train command on as many stages), down to this many")
        ->check(CLI::Range(1, 4096));
    s->add_option("command", options_.command,
                  "After --: a pipetrain subcommand (train CONFIG ...) or a program")
        ->required();
  }

  int run() override {
    char self[4096];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    options_.self = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(program_);
    // The app's own list of subcommands, so that whatever main() registers runs this binary
    // (option groups are nameless subcommands).
    for (const CLI::App* sub : app_.get_subcommands([](const CLI::App* a) { return !a->get_name().empty(); }))
      options_.subcommands.push_back(sub->get_name());
    return launch::run(options_);
  }

 private:
  const CLI::App& app_;
  const char* program_;
  launch::LaunchOptions options_;
};

}  // namespace

std::unique_ptr<Command> add_launch(CLI::App& app, const char* program) {
  return std::make_unique<Launch>(app, program);
}

}  // namespace pipetrain::apps
