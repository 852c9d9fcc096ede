#!/usr/bin/env bash
# The MLP pipeline (configs/mlp_bench.json: 2 stages, 8 micro-batches, 1024 wide, gpipe; CONFIG
# names another) as one process with a thread per stage (runtime.kind threads) against one
# process per stage (runtime.kind processes, started by pipetrain launch): over UCX as it runs by
# default (failure detection on: same-host peers watched through pidfds, shared memory), over
# UCX with only tcp allowed (UCX_TLS=tcp,self: what UCX's peer-failure mode gave same-host ranks
# before), with detection off, and over c10d's Gloo; run alternately on the same machine. Step
# time: the median of each run's steps after the first (warm-up), then the median over runs.
# Also checks that every runtime logged the same losses.
#
#   bench/processes.sh [build-dir]             (default: build)
#   REPEAT=5 STEPS=40 CONFIG=configs/fashion_mnist_cnn.json bench/processes.sh build
set -euo pipefail

build=${1:-build}
bin=$build/apps/pipetrain
repeat=${REPEAT:-3}
steps=${STEPS:-30}
config=${CONFIG:-configs/mlp_bench.json}
[[ -x $bin ]] || { echo "no $bin: build the pipetrain target" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

log=$work/log
for i in $(seq "$repeat"); do
  "$bin" train "$config" --quiet --steps "$steps" --metrics "$work/threads_$i.jsonl" > "$log" 2>&1 || { cat "$log"; exit 1; }
  # UCX as it runs by default (detection on; shared memory on one host), over tcp only, and with
  # detection off.
  "$bin" launch --nproc 2 -- train "$config" --quiet --steps "$steps" --metrics "$work/processes_$i.jsonl" \
    --set runtime.kind=processes > "$log" 2>&1 || { cat "$log"; exit 1; }
  UCX_TLS=tcp,self "$bin" launch --nproc 2 -- train "$config" --quiet --steps "$steps" \
    --metrics "$work/processes-tcp_$i.jsonl" --set runtime.kind=processes > "$log" 2>&1 || { cat "$log"; exit 1; }
  "$bin" launch --nproc 2 -- train "$config" --quiet --steps "$steps" --metrics "$work/processes-nodetect_$i.jsonl" \
    --set runtime.kind=processes --set runtime.detect_peer_failure=false > "$log" 2>&1 || { cat "$log"; exit 1; }
  "$bin" launch --nproc 2 -- train "$config" --quiet --steps "$steps" --metrics "$work/processes-gloo_$i.jsonl" \
    --set runtime.kind=processes --set runtime.transport=gloo > "$log" 2>&1 || { cat "$log"; exit 1; }
done

python3 - "$work" "$repeat" "$config" <<'EOF'
import json, statistics, sys
work, repeat, config = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cfg = json.load(open(config))
batch = cfg["data"]["batch_size"]
def run(kind, i):
    lines = [json.loads(l) for l in open(f"{work}/{kind}_{i}.jsonl") if l.strip()]
    steps = [l for l in lines if "event" not in l]
    return [s["loss"] for s in steps], statistics.median(s["step_time_s"] for s in steps[1:])
kinds = ("threads", "processes", "processes-tcp", "processes-nodetect", "processes-gloo")
names = {"threads": "threads (local)", "processes": "processes (ucx, default: shared memory, detection on)",
         "processes-tcp": "processes (ucx, tcp only: UCX_TLS=tcp,self)",
         "processes-nodetect": "processes (ucx, detection off)",
         "processes-gloo": "processes (c10d gloo, tcp)"}
res = {k: [run(k, i) for i in range(1, repeat + 1)] for k in kinds}
same = all(len({tuple(res[k][i][0]) for k in kinds}) == 1 for i in range(repeat))
med = {k: statistics.median(r[1] for r in v) for k, v in res.items()}
print(f"{config}: {cfg['pipeline']['stages']} stages, {cfg['pipeline']['micro_batches']} micro-batches, "
      f"batch {batch}; median of {repeat} runs (each the median of its steps after the first)")
print("| runtime | step (ms) | samples/s | vs threads | per run (ms) |")
print("|---|---|---|---|---|")
for k in kinds:
    runs = ", ".join(f"{r[1] * 1e3:.1f}" for r in res[k])
    print(f"| {names[k]} | {med[k] * 1e3:.1f} | {batch / med[k]:.0f} | {med[k] / med['threads']:.3f} | {runs} |")
print(f"losses {'bit-identical' if same else 'DIFFER'} across the {len(kinds)} in every run")
EOF
