#!/usr/bin/env bash
# Data parallel x pipeline on this machine: every config at K = 1, 2 stages x D = 1, 2, 4 copies
# (2 micro-batches, gpipe, no recomputation), each against the plain single-device loop on the
# same batches in the same run; the GPT and the MLP again with the optimizer state sharded.
# Writes bench/results/data_parallel.jsonl and the tables in bench/results/data_parallel.md.
# About 2 minutes on a 2-core machine.
# Usage: bench/data_parallel.sh [build dir]
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$build/apps/pipetrain
out=$here/bench/results
results=$out/data_parallel.jsonl
: >"$results"
# One intra-op thread per stage and copy, so that the plain loop it is compared with is the
# same one-thread loop in every row (and the all-cores loop the same two-thread one).
common=(--set runtime.intra_op_threads=1 --stages 1,2 --data-parallel 1,2,4 --micro-batches 2 --schedule gpipe
        --recompute never --warmup 2 --repeat 10 --json "$results")
start=$(date +%s)
# The CNN on synthetic images of Fashion-MNIST's shape (speed, not accuracy).
"$bin" bench "$here/configs/fashion_mnist_cnn.json" --set data.kind=synthetic "${common[@]}"
"$bin" bench "$here/configs/gpt_small.json" "${common[@]}"
"$bin" bench "$here/configs/mlp_bench.json" --set pipeline.balance=uniform "${common[@]}"
for cfg in gpt_small mlp_bench; do
  "$bin" bench "$here/configs/$cfg.json" --set pipeline.balance=uniform --set train.shard_optimizer=true \
    --set runtime.intra_op_threads=1 --stages 1,2 --data-parallel 2,4 --micro-batches 2 --schedule gpipe --recompute never --warmup 2 --repeat 10 \
    --json "$results"
done
echo "data_parallel: $(( $(date +%s) - start )) s"
python3 "$here/bench/data_parallel.py" "$results" >"$out/data_parallel.md"
cat "$out/data_parallel.md"
