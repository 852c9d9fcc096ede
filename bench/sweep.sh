#!/usr/bin/env bash
# The standard sweep: the MLP, CNN and GPT configs at 1, 2 and 4 stages, 1-32 micro-batches,
# every schedule and every recomputation mode, each against the plain single-device loop in the
# same run; then the plots. About 20 minutes on a 2-core machine.
# Usage: bench/sweep.sh [build dir] [out dir]   (default: build, bench/results/sweep)
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
out=${2:-$here/bench/results/sweep}
bin=$build/apps/pipetrain
mkdir -p "$out"
results=$out/results.jsonl
: > "$results"
common=(--micro-batches 1,2,4,8,16,32 --recompute always,except_last,never --warmup 1 --repeat 3 --min-time 0
        --json "$results")
# One stage runs every schedule the same way (no communication, nothing to overlap): gpipe only.
sweep() {
  "$bin" bench "$@" "${common[@]}" --stages 1 --schedule gpipe
  "$bin" bench "$@" "${common[@]}" --stages 2,4 --schedule gpipe,1f1b,interleaved-1f1b,zb-h1
}
start=$(date +%s)
sweep "$here/configs/mlp_bench.json"
# The CNN on synthetic images of the same shape (the sweep measures speed, not accuracy), at
# batch 64 so that 32 micro-batches have two samples each.
sweep "$here/configs/fashion_mnist_cnn.json" --set data.kind=synthetic --set data.batch_size=64
sweep "$here/configs/gpt_small.json"
echo "sweep: $(( $(date +%s) - start )) s"

# One step of the MLP headline configuration, as a timeline picture.
"$bin" train "$here/configs/mlp_bench.json" --steps 3 --quiet --trace "$out/mlp_2stages_8mb.trace.json" >/dev/null
if ! command -v gnuplot >/dev/null; then
  echo "sweep: gnuplot not found; install gnuplot-nox and run: bench/plot.py $results $out --trace $out/mlp_2stages_8mb.trace.json"
  exit 0
fi
python3 "$here/bench/plot.py" "$results" "$out" --trace "$out/mlp_2stages_8mb.trace.json"
