#!/usr/bin/env bash
# What the balance method buys: for the shipped CNN and GPT configs, the plan's predicted step
# (profiled layer costs, simulated) against the measured step, for uniform, parameters and time.
# Usage: bench/balance.sh [build dir] > bench/results/balance.txt
set -euo pipefail
build=${1:-build}
bin=$build/apps/pipetrain
here=$(cd "$(dirname "$0")/.." && pwd)
echo "# $(date -u +%Y-%m-%d) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; pipetrain bench, warmup 3, repeat 10"
printf '%-18s %-6s %-11s %-16s %12s %12s %9s %12s %9s\n' config stages balance split predicted_ms measured_ms error plain_ms speedup
for run in fashion_mnist_cnn:4 fashion_mnist_cnn:2 gpt_small:2 gpt_small:3; do
  cfg=${run%%:*} stages=${run##*:}
  for method in uniform parameters time; do
    out=$("$bin" bench "$here/configs/$cfg.json" --set pipeline.balance=$method --set pipeline.stages=$stages 2>&1)
    split=$(echo "$out" | sed -n "s/^batch .*, balance [a-z]* \(\[.*\]\)$/\1/p")
    measured=$(echo "$out" | sed -n 's/^step \([0-9.]*\) ms measured.*/\1/p')
    prof=$(echo "$out" | sed -n 's/.*from profiled layer costs \([0-9.]*\) ms (\([-+0-9.]*%\)).*/\1 \2/p')
    plain=$(echo "$out" | awk '$1=="single-device" && $2!="," {print $3}')
    speed=$(echo "$out" | sed -n 's/^pipeline \/ plain (same threads per stage): \([0-9.]*\)x.*/\1/p')
    set -- $prof
    printf '%-18s %-6s %-11s %-16s %12s %12s %9s %12s %9s\n' "$cfg" "$stages" "$method" "$split" "$1" "$measured" "$2" "$plain" "$speed"
  done
done
