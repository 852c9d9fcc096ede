// The job's pipeline in the config's runtime. runtime.kind threads: every stage in this process.
// processes: this process is one rank (rank and world from the launcher's environment,
// comm/launcher_env.h); the ranks meet through the store at the master address, check that they
// run the same configuration (and what else they must agree on), and connect their transport
// endpoints, all within runtime.timeout_s.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "job/job.h"

namespace pipetrain::job {

// Receives what the runtime has to say about the set-up (a launcher starting in-process runs,
// threads outnumbering cores); the caller decides where it goes.
using NoteSink = std::function<void(const std::string&)>;

// `run_options`: what the ranks must agree on beyond the config (e.g. the resume flag).
std::unique_ptr<Pipeline> make_pipeline(Job& job, const std::string& run_options = "", const NoteSink& note = {});
// libtorch's process-wide kernel switches from runtime.cudnn_benchmark, runtime.tf32 and
// runtime.deterministic (make_pipeline sets them).
void apply_kernel_switches(const RuntimeConfig& runtime);

// The hash the ranks of a multi-process run compare at the rendezvous.
std::string run_fingerprint(const Config& config, const std::string& run_options = "");

}  // namespace pipetrain::job
