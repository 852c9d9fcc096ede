#!/usr/bin/env bash
# Set up, build, and run the whole test suite with ctest (extra arguments go to ctest,
# e.g. -L unit).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
build=${PIPETRAIN_BUILD_DIR:-$root/build}
"$build/apps/pipetrain" --version  # what this build compiled in (CUDA, NCCL, UCX) and sees
ctest --test-dir "$build" -j "$(nproc)" --output-on-failure --timeout 300 "$@"
