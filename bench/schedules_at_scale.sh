#!/usr/bin/env bash
# Every schedule simulated on transformer cost models of hardware this machine does not have
# (`pipetrain costs transformer`, then `pipetrain simulate --json`): step, bubble and the
# largest per-device peak memory (activations at their peak + parameters, gradients, Adam).
# Usage: bench/schedules_at_scale.sh [build dir] > bench/results/schedules_at_scale.txt
set -euo pipefail
build=${1:-build}
bin=$build/apps/pipetrain
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# A 7B GPT (32 layers, hidden 4096, 4096 tokens) on H100s: 989 TFLOP/s bf16 at 45%, 50 GB/s links.
"$bin" costs transformer --layers 32 --hidden 4096 --seq 4096 --heads 32 --vocab 50257 --micro-batch 1 \
  --device-tflops 989 --efficiency 0.45 --bandwidth 50 --out "$dir/gpt7b.json" > /dev/null
# A 1.5B-class GPT (24 layers, hidden 2048, 2048 tokens) on the same devices, 4 sequences per micro-batch.
"$bin" costs transformer --layers 24 --hidden 2048 --seq 2048 --heads 16 --vocab 50257 --micro-batch 4 \
  --device-tflops 989 --efficiency 0.45 --bandwidth 50 --out "$dir/gpt1b.json" > /dev/null
echo "# $(date -u +%Y-%m-%d) pipetrain simulate on pipetrain costs transformer (see the commands in this script)"
printf '%-6s %3s %4s %-17s %11s %8s %14s\n' model K M schedule step_ms bubble max_peak_GiB
for model in gpt7b gpt1b; do
  for k in 8 16; do
    [ "$model" = gpt1b ] && [ "$k" = 16 ] && continue
    for m in $((2 * k)) $((4 * k)) $((8 * k)); do
      for s in gpipe 1f1b interleaved-1f1b looped-bfs zb-h1 zb-h2 zb-v dualpipev zb-auto; do
        out=$("$bin" simulate --costs "$dir/$model.json" --stages "$k" --micro-batches "$m" --schedule "$s" --json 2>&1) || {
          printf '%-6s %3s %4s %-17s skipped: %s\n' "$model" "$k" "$m" "$s" "$(echo "$out" | tail -1)"
          continue
        }
        python3 -c '
import json, sys
j = json.loads(sys.argv[1])
print("%-6s %3d %4d %-17s %11.1f %8.4f %14.1f" % (sys.argv[2], j["stages"], j["micro_batches"], j["schedule"],
      j["step_ms"], j["bubble"], max(j["peak_memory_bytes"]) / 2**30))' "$out" "$model"
      done
    done
  done
done
