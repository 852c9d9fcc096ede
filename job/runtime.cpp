// The job's pipeline in its runtime (job/runtime.h).
#include "job/runtime.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include "comm/launcher_env.h"
#include "comm/mesh.h"
#include "comm/process_group.h"
#include "comm/rendezvous.h"
#include "stages/accelerator.h"
#include "stages/device.h"
#include "common/error.h"
#include "common/log.h"
#include "job/balance.h"
#include "profiler/profile.h"

namespace pipetrain::job {

std::string run_fingerprint(const Config& c, const std::string& run_options) {
  // train.steps as run (--steps replaces the file's value without touching root).
  return comm::config_fingerprint(c.root.dump() + " steps=" + std::to_string(c.train.steps) + " " + run_options);
}

// The thread that drives the stages (the caller) prepares each batch with as many intra-op
// threads as a stage has: with more, OpenMP's idle team workers spin after every parallel
// region and take cores from the stage threads (about 15% of the default CNN run's step on 2
// cores, where 4 stage threads share them).
namespace {
void match_stage_threads(const Job& job) { at::set_num_threads(std::max(1, job.options.intra_op_threads)); }

// An explicit runtime.intra_op_threads that gives more compute threads than cores (intra-op
// threads x the stages on this host) makes OpenMP teams time-share the cores, many times slower;
// say so rather than be silently slow. (The default, cores / stages and at least one, only
// shares cores when there are more stages than cores, which costs far less.)
void warn_if_oversubscribed(const Job& job, int stages_here, const NoteSink& note) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t threads = int64_t(job.options.intra_op_threads) * stages_here;
  if (job.config.runtime.intra_op_threads > 1 && threads > cores && note)
    note(detail::concat("warning: ", job.options.intra_op_threads, " intra-op threads per stage x ", stages_here,
                        " stage", stages_here == 1 ? "" : "s", " on this host = ", threads, " threads on ", cores,
                        " cores; expect a large slowdown (runtime.intra_op_threads 0 picks cores / stages)"));
}

// train.precision bf16 on a CPU stage where the CPU lacks the instructions that make bf16
// products fast (stages::slow_bf16_warning): one line, with a short measurement of the cost.
void warn_if_slow_bf16(const Job& job, const NoteSink& note) {
  if (job.options.precision != Precision::BF16) return;
  if (!job.devices.any_cpu()) return;
  const stages::CpuInfo cpu = stages::cpu_info();
  if (!cpu.flags_known || cpu.fast_bf16()) return;
  const std::string line = stages::slow_bf16_warning(cpu, profiler::bf16_speed(3));
  if (note)
    note("warning: " + line);
  else
    log::warning(line);
}
}  // namespace

void apply_kernel_switches(const RuntimeConfig& r) {
  auto& ctx = at::globalContext();
  ctx.setBenchmarkCuDNN(r.cudnn_benchmark);
  ctx.setAllowTF32CuBLAS(r.tf32);
  ctx.setAllowTF32CuDNN(r.tf32);
  ctx.setDeterministicCuDNN(r.deterministic);
  ctx.setDeterministicAlgorithms(r.deterministic, /*warn_only=*/false);
}

std::unique_ptr<Pipeline> make_pipeline(Job& job, const std::string& run_options, const NoteSink& note) {
  const Config& c = job.config;
  apply_kernel_switches(c.runtime);
  if (job.options.balance.empty()) job.options.balance = resolve_balance(job);
  // pipeline.devices "auto" says what it chose: whenever that is a GPU, and always when asked for.
  if (note && job.devices.worth_noting()) note("note: " + job.devices.note);
  warn_if_slow_bf16(job, note);
  if (c.runtime.kind != RuntimeKind::Processes) {
    match_stage_threads(job);
    warn_if_oversubscribed(job, c.pipeline.stages * c.pipeline.data_parallel, note);
    // Started by a launcher but in-process: each rank runs the whole pipeline on its own.
    comm::RankInfo info;
    try {
      info = comm::rank_from_env(comm::process_environment());
    } catch (const ConfigError&) {  // not meant for us
    }
    if (info.world_size > 1 && info.rank == 0 && note)
      note(detail::concat("note: started as one of ", info.world_size, " ranks (", info.launcher,
                          ") with runtime.kind threads: every rank runs all ", c.pipeline.stages,
                          " stages on its own; runtime.kind=processes runs one stage per rank"));
    log::debug(detail::concat(c.pipeline.stages, " stages as threads of this process, transport ",
                              comm::name(job.options.transport.backend)));
    return std::make_unique<Pipeline>(job.model.layers, job.options, mean_cross_entropy);
  }
  const comm::RankInfo info = comm::rank_from_env(comm::process_environment());
  log::set_rank(info.rank, info.world_size);
  const int D = c.pipeline.data_parallel;
  if (info.world_size != c.pipeline.stages * D)
    throw ConfigError(detail::concat(c.where("runtime.kind"), ": processes runs one rank per stage",
                                     D > 1 ? " and copy" : "", ", but pipeline.stages is ", c.pipeline.stages,
                                     D > 1 ? detail::concat(" x pipeline.data_parallel ", D, " = ", c.pipeline.stages * D) : "",
                                     " and the launcher (", info.launcher, ") started ", info.world_size,
                                     " rank", info.world_size == 1 ? "" : "s",
                                     info.launcher == "none" ? " (start the ranks with pipetrain launch, torchrun-style variables, mpirun or srun)" : ""));
  // Each host's cores are shared by the ranks on it, not by all stages.
  if (c.runtime.intra_op_threads == 0 && info.local_world_size > 0)
    job.options.intra_op_threads = intra_op_threads(c.runtime, info.local_world_size);
  match_stage_threads(job);
  if (info.rank == 0) warn_if_oversubscribed(job, info.local_world_size > 0 ? info.local_world_size : 1, note);
  // UCX listens only on the interface by which this host reaches rank 0's, not on every one.
  job.options.transport.net_devices = comm::ucx_devices_towards(info.master_addr);
  const Deadline deadline = Deadline::after(c.runtime.timeout_s);
  // Data parallelism: the ranks of one stage (pipeline outer, data inner: rank = stage * D +
  // copy) form a Gloo group through the rendezvous store, on the interface towards rank 0. The
  // c10d transports (gloo, nccl) join their groups there too; UCX exchanges addresses instead.
  const comm::Mesh mesh{c.pipeline.stages, D};
  const std::string interface = comm::interface_towards(info.master_addr);
  const bool c10d_transport = comm::info(job.options.transport.backend).c10d;
  if (!job.options.devices.empty()) job.options.transport.device = job.options.devices[mesh.stage_of(info.rank)];
  comm::ProcessGroup copies;
  std::unique_ptr<comm::Transport> endpoint;
  const comm::StoreHook join_groups = [&](const c10::intrusive_ptr<c10d::Store>& store) {
    if (c10d_transport)
      endpoint = comm::make_group_transport(job.options.transport, store, "pipetrain/transport/", info.rank,
                                            info.world_size, interface);
    // The copies' gradient reduction: over NCCL between GPUs (one per rank), over Gloo otherwise.
    const std::string copies_prefix = detail::concat("pipetrain/stage", mesh.stage_of(info.rank), "/copies/");
    if (D > 1 && job.options.transport.device.is_cuda() && comm::info(comm::Backend::Nccl).compiled)
      copies = comm::make_nccl_group(store, copies_prefix, mesh.copy_of(info.rank), D, c.runtime.timeout_s);
    else if (D > 1)
      copies = comm::make_gloo_group(store, copies_prefix, mesh.copy_of(info.rank), D, interface, c.runtime.timeout_s);
  };
  log::debug(detail::concat("rank ", info.rank, " of ", info.world_size, " (", info.launcher, "): stage ",
                            mesh.stage_of(info.rank), ", meeting at ", info.master_addr, ":", info.master_port,
                            ", transport ", comm::name(job.options.transport.backend)));
  const comm::AddressExchange exchange =
      comm::store_exchange(info, run_fingerprint(c, run_options), deadline, "pipetrain", join_groups);
  if (c10d_transport)
    exchange(std::string("c10d ") + comm::name(job.options.transport.backend));  // the rendezvous; the hook makes the endpoint
  else
    endpoint = comm::make_process_transport(job.options.transport, info.rank, info.world_size, exchange);
  return std::make_unique<Pipeline>(job.model.layers, job.options, mean_cross_entropy, std::move(endpoint), copies);
}

}  // namespace pipetrain::job
