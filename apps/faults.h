// Fault injection for the tests of whole processes: PIPETRAIN_FAULT=POINT:RANK:STEP:ACTION[:ATTEMPT]
// (several separated by ',') installs a hook (common/fault.h) that sends this process SIGKILL
// (ACTION kill) or SIGSTOP (stop) when it reaches fault point POINT ("pipeline.step",
// "pipeline.reduce", "checkpoint.shard") as RANK at STEP, once; ATTEMPT (default 0) limits it to
// that start of a job restarted by pipetrain launch --max-restarts (PIPETRAIN_RESTART). The
// environment is read once, at start; unset or empty: no hook.
#pragma once

namespace pipetrain::apps {

// Throws ConfigError naming the variable when its value is malformed.
void install_faults_from_environment();

}  // namespace pipetrain::apps
