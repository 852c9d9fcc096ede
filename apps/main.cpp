// The pipetrain command: --version, and a dispatch to its subcommands (apps/commands.h), one
// file each, with every error reported as one line and an exit status.
#include <malloc.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>

#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include "apps/commands.h"
#include "apps/faults.h"
#include "apps/option_flags.h"
#include "comm/process_group.h"
#include "comm/transport.h"
#include "common/config.h"
#include "common/error.h"
#include "common/log.h"
#include "common/strings.h"
#include "stages/accelerator.h"
#include "stages/library_warnings.h"

namespace comm = pipetrain::comm;
namespace apps = pipetrain::apps;

namespace {

// An error as one printable line of bounded length, whatever bytes the input put in it.
void report(const std::string& message) {
  pipetrain::log::error(pipetrain::printable(apps::with_flags(message), 600));
}

// `pipetrain --version`: this build, its libtorch, and what is compiled in and usable here.
std::string version_text() {
  const auto acc = pipetrain::stages::accelerator_info();
  std::ostringstream o;
  o << "pipetrain " << PIPETRAIN_VERSION << "\n";
  o << "libtorch " << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR << "." << TORCH_VERSION_PATCH
    << (acc.cuda ? " (CUDA " + acc.cuda_runtime + ")" : " (CPU only)") << "\n";
  if (acc.cuda) {
    o << "CUDA: compiled in, runtime " << acc.cuda_runtime << "; GPUs seen: " << acc.gpus;
    if (acc.gpus == 0) o << " (" << acc.no_gpu_reason << ")";
    o << "\n";
    o << "cuDNN: " << (acc.cudnn.empty() ? "not in this libtorch" : acc.cudnn) << "\n";
  } else {
    o << "CUDA: not compiled in; GPUs seen: 0\n";
  }
  o << "NCCL: " << (acc.nccl ? "compiled in, " + acc.nccl_version : std::string("not compiled in")) << "\n";
  const bool ucx = comm::info(comm::Backend::Ucx).compiled;
  o << "UCX: "
    << (ucx ? "compiled in, " + comm::transport_backend_version(comm::Backend::Ucx) : std::string("not compiled in"))
    << (ucx ? (PIPETRAIN_UCX_CUDA ? "; UCX_CUDA=1 (device memory between processes)"
                                  : "; UCX_CUDA=0 (a GPU's tensors through the host)")
            : "");
  // The transports, from their table (comm/backend.h): those compiled in, then what the others need.
  std::vector<std::string> have, lack;
  for (const comm::BackendInfo& t : comm::backend_table())
    (t.compiled ? have : lack).push_back(t.compiled ? t.name : std::string(t.name) + " (needs " + t.needs + ")");
  o << "\ntransports: " << pipetrain::join(have, ", ")
    << (lack.empty() ? "" : "; not compiled in: " + pipetrain::join(lack, ", "));
  const auto cpu = pipetrain::stages::cpu_info();
  o << "\nCPU: " << (cpu.model.empty() ? std::string("?") : cpu.model) << "; bf16 products: "
    << (!cpu.flags_known ? "unknown (no CPU flags listed)"
        : cpu.avx512_bf16 && cpu.amx_bf16 ? "fast (AVX-512 BF16, AMX)"
        : cpu.avx512_bf16 ? "fast (AVX-512 BF16)"
        : cpu.amx_bf16 ? "fast (AMX)"
                        : "slow (neither AVX-512 BF16 nor AMX)");
  return o.str();
}

}  // namespace

int main(int argc, char** argv) {
  // glibc would hand large freed tensors back to the system after every step and fault them
  // in again on the next; keeping them saves about 10% of an MLP step (README, Benchmarks).
  pipetrain::comm::prepare_nccl_environment();  // before any thread reads the environment
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum on 64-bit
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  pipetrain::stages::route_library_warnings();  // libtorch's warnings as one line each, once

  CLI::App app{"pipetrain: pipeline-parallel training (GPipe) on libtorch", "pipetrain"};
  app.set_version_flag("--version", version_text);
  app.require_subcommand(1);
  // Before the subcommand; PIPETRAIN_LOG_LEVEL says the same, and carries it to launched ranks.
  std::string log_level;
  app.add_option("--log-level", log_level,
                 "Messages to print: debug, info (the default), warning, error or off (or PIPETRAIN_LOG_LEVEL)")
      ->check(CLI::IsMember({"debug", "info", "warning", "warn", "error", "off"}));
  // In the order --help lists them.
  const std::unique_ptr<apps::Command> commands[] = {
      apps::add_train(app),    apps::add_eval(app),  apps::add_generate(app), apps::add_launch(app, argv[0]),
      apps::add_export(app),   apps::add_bench(app), apps::add_plan(app),     apps::add_partition(app),
      apps::add_simulate(app), apps::add_costs(app)};

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    report(std::string(e.what()) + " (see --help)");
    return 2;
  }

  if (!log_level.empty()) {
    pipetrain::log::set_level(pipetrain::log::parse_level(log_level, "--log-level"));
    setenv("PIPETRAIN_LOG_LEVEL", log_level.c_str(), 1);  // the ranks a launch starts
  }
  try {
    apps::install_faults_from_environment();
    for (const auto& command : commands)
      if (command->given()) return command->run();
  } catch (const pipetrain::ConfigError& e) {
    report(e.what());
    return 2;
  } catch (const pipetrain::Error& e) {
    report(e.what());
    return 1;
  } catch (const c10::Error& e) {  // the first line: libtorch may add its source and more lines
    report(pipetrain::stages::library_message_line(e.what_without_backtrace()));
    return 1;
  } catch (const std::exception& e) {
    report(pipetrain::stages::library_message_line(e.what()));
    return 1;
  }
  return 0;
}
