// The pipetrain subcommands, one file each (apps/cmd_<name>.cpp). Each add_<name> adds its
// subcommand and options to the app and returns the command that runs it, so that a
// subcommand's flags and its logic sit together and main() only parses and dispatches.
#pragma once

#include <memory>

#include <CLI/CLI.hpp>

namespace pipetrain::apps {

// One subcommand, bound to the variables its options fill. run() is called once, after the
// command line parsed, on the subcommand that was given; it returns the exit status and throws
// pipetrain errors (main() turns them into one line and a status).
class Command {
 public:
  explicit Command(CLI::App* subcommand) : subcommand_(subcommand) {}
  virtual ~Command() = default;
  Command(const Command&) = delete;  // its options point into it
  Command& operator=(const Command&) = delete;

  bool given() const { return subcommand_->parsed(); }
  virtual int run() = 0;

 protected:
  CLI::App* subcommand_;
};

// In the order of `pipetrain --help`.
std::unique_ptr<Command> add_train(CLI::App& app);
std::unique_ptr<Command> add_eval(CLI::App& app);
std::unique_ptr<Command> add_generate(CLI::App& app);
// `program`: argv[0], the binary the ranks run when /proc/self/exe cannot be read.
std::unique_ptr<Command> add_launch(CLI::App& app, const char* program);
std::unique_ptr<Command> add_export(CLI::App& app);
std::unique_ptr<Command> add_bench(CLI::App& app);
std::unique_ptr<Command> add_plan(CLI::App& app);
std::unique_ptr<Command> add_partition(CLI::App& app);
std::unique_ptr<Command> add_simulate(CLI::App& app);
std::unique_ptr<Command> add_costs(CLI::App& app);

}  // namespace pipetrain::apps
