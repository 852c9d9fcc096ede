#!/usr/bin/env bash
# A Llama model of about 20M parameters: pipetrain on 2 stages against transformers' eager loop on
# both cores, alternating runs (bench/hf_throughput.py says how). Writes
# bench/results/hf_throughput.jsonl (a line per run, the summary last) and prints the table.
# With the defaults (5 rounds of 3 + 10 steps) about 10 minutes on an idle 2-core machine, 35 at a
# load average of 10 (one round took 7 minutes then); extra arguments go to the .py
# (--rounds 1 --steps 2 --warmup 1: a check that it works end to end, in a few minutes).
# Usage: bash bench/hf_throughput.sh [build dir] [options]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
build=${1:-$root/build}
shift || true
exec "$(pipetrain_python)" "$root/bench/hf_throughput.py" "$build/apps/pipetrain" \
  --json "$root/bench/results/hf_throughput.jsonl" "$@"
