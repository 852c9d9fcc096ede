#!/usr/bin/env bash
# Measured step time against the simulator, per schedule, for the MLP and GPT configs at 2 and
# 4 stages and 8 and 16 micro-batches (`pipetrain bench` on each combination; one line each).
# Usage: bench/schedules.sh [build dir] > bench/results/schedules.txt
# SCHEDULES, KS, MS and RECOMPUTE (space-separated) narrow or widen the grid, and BALANCE
# (default uniform) sets pipeline.balance, e.g.
#   SCHEDULES="1f1b zb-h2 zb-v" KS=2 RECOMPUTE=never bench/schedules.sh build
set -euo pipefail
build=${1:-build}
bin=$build/apps/pipetrain
here=$(cd "$(dirname "$0")/.." && pwd)
echo "# $(date -u +%Y-%m-%d) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; pipetrain bench, warmup 3, repeat 10"
printf '%-5s %-17s %2s %3s %-12s %9s %9s %7s %9s %7s %9s %11s %11s\n' model schedule K M recompute \
  plain_ms pipe_ms speedup sim_ms sim_err prof_ms in_flight peak_MiB
for model in mlp_bench gpt_small; do
  for k in ${KS:-2 4}; do
    for m in ${MS:-8 16}; do
      for sched in ${SCHEDULES:-gpipe 1f1b interleaved-1f1b zb-h1}; do
        for ckpt in ${RECOMPUTE:-never except_last}; do
          sets=(--set pipeline.stages=$k --set pipeline.micro_batches=$m --set pipeline.schedule=$sched
                --set pipeline.recompute=$ckpt --set pipeline.balance=${BALANCE:-uniform})
          [ "$model" = gpt_small ] && sets+=(--set data.batch_size=64)
          out=$("$bin" bench "$here/configs/$model.json" "${sets[@]}" 2>&1) || {
            printf '%-5s %-17s %2s %3s %-12s %s\n' "${model%%_*}" "$sched" "$k" "$m" "$ckpt" \
              "skipped: $(echo "$out" | tail -1 | sed 's/^pipetrain: error: //')"
            continue
          }
          plain=$(echo "$out" | awk '$1=="single-device" && $2!="," {print $3}')
          pipe=$(echo "$out" | awk '$1=="pipeline" && $2=="1/st" {print $3}')
          speed=$(echo "$out" | sed -n 's/^pipeline \/ plain (same threads per stage): \([0-9.]*\)x.*/\1/p')
          sim=$(echo "$out" | sed -n 's/.*simulated from its measured op costs \([0-9.]*\) ms (\([-+0-9.]*%\)).*/\1 \2/p')
          prof=$(echo "$out" | sed -n 's/.*from profiled layer costs \([0-9.]*\) ms.*/\1/p')
          fl=$(echo "$out" | sed -n 's/.*peak in-flight micro-batches \([0-9\/]*\)$/\1/p')
          mem=$(echo "$out" | sed -n 's/.*pipeline \([0-9.]*\) MiB (all stages).*/\1/p')
          printf '%-5s %-17s %2s %3s %-12s %9s %9s %7s %9s %7s %9s %11s %11s\n' "${model%%_*}" "$sched" "$k" "$m" \
            "$ckpt" "$plain" "$pipe" "$speed" $sim "$prof" "$fl" "$mem"
        done
      done
    done
  done
done
