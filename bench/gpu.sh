#!/usr/bin/env bash
# The GPU benchmarks (scripts/gpu.sh runs this after the gpu tests):
#   bash bench/gpu.sh BUILD_DIR RESULTS_DIR [PART ...]
# PARTs: speed, transfers, gpt24, pipeline, fashion (default: $GPU_BENCH_PARTS, else speed, transfers
# and gpt24; pipeline and fashion were measured before and take another call). The parts share a
# budget of $GPU_BENCH_BUDGET_S seconds (default 540, inside a 10-minute call): each part's timeout
# is cut to what is left, and a part that would start with under 30 s left is skipped, said in
# skipped.txt, so that the call ends with what was measured rather than being killed. They run
# in the order transfers, speed, gpt24 (the shortest first), whatever order they are named in.
# speed writes RESULTS_DIR/speed.jsonl (bench/gpu_pipeline.cpp --speed: the small GPT as the plain
# loop and as 2 stages with and without CUDA graphs; the 24-layer GPT as the plain loop and as 4
# stages 1F1B with and without graphs, each one's peak memory; its largest batch with and without
# recomputation).
# GPU_TRANSFER_TRANSPORTS (default ucx,nccl,gloo), GPU_UCX_SETTINGS (the rendezvous settings
# UCX is measured under at 64 MiB), GPU_SPEED_ARGS (more gpu_pipeline flags) and
# GPU_GPT24_TRANSPORTS (default "ucx nccl") narrow a call to what is to be measured again.
# Writes RESULTS_DIR/machine.jsonl (the device, driver and clocks, read before and after) and
# RESULTS_DIR/transfers.jsonl (bench/transfer_gpu.cpp: two processes on the GPU, GB/s per transport,
# direction and size beside cudaMemcpy's; transfers_ucx_settings.jsonl the same for UCX at 64 MiB
# under other rendezvous settings, transfers_ucx_protocols.log the protocols UCX picked), RESULTS_DIR/gpu_pipeline.jsonl (bench/gpu_pipeline.cpp: a 24-layer GPT, d_model 1024,
# sequence 1024, as the plain loop and as 1, 2 and 4 stages on the same GPU; peak memory per
# recomputation mode; the largest batch with and without recomputation), and fashion.jsonl (the
# default config trained on the GPU and on the CPU). Commit them under bench/results/gpu/.
set -uo pipefail
build=$1
out=$2
shift 2
parts=" ${*:-${GPU_BENCH_PARTS:-speed transfers gpt24}} "
part() { [[ "$parts" == *" $1 "* ]]; }
mkdir -p "$out"
budget_end=$(( $(date +%s) + ${GPU_BENCH_BUDGET_S:-540} ))
# The timeout for a part that would like $1 seconds: at most what the budget has left; 0 (skip)
# under 30 s.
within() {
  local left=$(( budget_end - $(date +%s) ))
  if [ "$left" -lt 30 ]; then echo 0; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
skip() { echo "$1: skipped, the budget of ${GPU_BENCH_BUDGET_S:-540} s was spent" | tee -a "$out/skipped.txt"; }
machine() {
  local when=$1
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw \
    --format=csv,noheader,nounits 2>/dev/null | head -1 | while IFS=, read -r name driver mem sm memclk maxsm temp power; do
    printf '{"when":"%s","date":"%s","device":"%s","driver":"%s","memory_mib":%s,"clock_sm_mhz":%s,"clock_mem_mhz":%s,"clock_sm_max_mhz":%s,"temperature_c":%s,"power_w":%s,"torch":"%s"}\n' \
      "$when" "$(date -u +%FT%TZ)" "$(echo $name)" "$(echo $driver)" $mem $sm $memclk $maxsm $temp $power \
      "$(python3 -c 'import torch;print(torch.__version__)' 2>/dev/null)"
  done >>"$out/machine.jsonl"
}
machine before
status=0
# Two processes on the one GPU: CUDA tensors over nccl, ucx and gloo, both directions, against a
# device-to-device copy (bench/transfer_gpu.cpp).
if part transfers && [ -x "$build/bench/transfer_gpu" ]; then
  t=$(within 180)
  if [ "$t" -gt 0 ]; then
    timeout "$t" "$build/bench/transfer_gpu" "$out/transfers.jsonl" --transports "${GPU_TRANSFER_TRANSPORTS:-ucx,nccl,gloo}" \
      >"$out/transfers.log" 2>&1 || status=$?
  else skip transfers; fi
  # Where UCX's time goes at 64 MiB: the protocols it picked (UCX_PROTO_INFO=used, printed through
  # our log at info level into transfers_ucx_protocols.log), and the same transfer under other
  # rendezvous settings, each line labelled with them (transfers_ucx_settings.jsonl); read_ahead=0
  # is the transport receiving no message ahead (TransportOptions::read_ahead), for comparison.
  # GPU_UCX_SETTINGS: a shorter list (e.g. "default read_ahead=0") where the others were measured.
  for setting in ${GPU_UCX_SETTINGS:-default read_ahead=0 UCX_MAX_RNDV_RAILS=1 UCX_RNDV_SCHEME=get_zcopy \
      UCX_RNDV_SCHEME=put_zcopy UCX_PROTO_ENABLE=n UCX_TLS=sm,self,cuda_copy,cuda_ipc}; do
    t=$(within 40)
    if [ "$t" -eq 0 ]; then skip "transfers_ucx $setting"; continue; fi
    env=(UCX_PROTO_INFO=used PIPETRAIN_LOG_LEVEL=info)
    args=(--sizes 67108864,268435456)  # and 256 MiB: how the cost per message scales
    case "$setting" in
      default) ;;
      read_ahead=0) args+=(--read-ahead 0); env=() ;;
      *) args=(--sizes 67108864); env=("$setting") ;;
    esac
    env "${env[@]}" timeout "$t" "$build/bench/transfer_gpu" "$out/transfers_ucx_settings.jsonl" --transports ucx \
      "${args[@]}" --label "$setting" >>"$out/transfers_ucx_protocols.log" 2>&1 || status=$?
  done
fi
if part speed && [ -x "$build/bench/gpu_pipeline" ]; then
  t=$(within 270)
  if [ "$t" -gt 0 ]; then
    # shellcheck disable=SC2086  # GPU_SPEED_ARGS: e.g. "--small 0 --largest 0" (measured before)
    timeout "$t" "$build/bench/gpu_pipeline" "$out/speed.jsonl" --speed 1 ${GPU_SPEED_ARGS:-} >"$out/speed.log" 2>&1 || status=$?
  else skip speed; fi
fi
if part pipeline; then
  t=$(within 300)
  if [ "$t" -gt 0 ]; then
    timeout "$t" "$build/bench/gpu_pipeline" "$out/gpu_pipeline.jsonl" ${GPU_PIPELINE_ARGS:-} || status=$?
  else skip pipeline; fi
fi
# The 24-layer GPT (d_model 1024, sequence 1024, bf16) in 2 stages on the one GPU: as threads of
# one process, and as 2 processes over ucx (device memory where UCX_CUDA=1) and nccl (two host ids,
# sockets: slow by design). Median step time of steps 3 on, per run, in gpt24_processes.jsonl.
if part gpt24 && [ -x "$build/apps/pipetrain" ]; then
  cfg=$out/gpt24.json
  cat >"$cfg" <<'EOF'
{"model": {"family": "gpt", "vocab_size": 32000, "seq_len": 1024, "d_model": 1024, "n_heads": 16, "n_layers": 24,
           "d_ff": 4096, "dropout": 0.0},
 "data": {"kind": "synthetic", "batch_size": 16, "samples": 256, "test_samples": 16},
 "pipeline": {"stages": 2, "micro_batches": 8, "schedule": "1f1b", "devices": "cuda:0"},
 "optimizer": {"kind": "adamw", "lr": 0.0001},
 "train": {"steps": 8, "precision": "bf16"},
 "runtime": {"timeout_s": 120}}
EOF
  t=$(within 120)
  if [ "$t" -gt 0 ]; then
    timeout "$t" "$build/apps/pipetrain" train "$cfg" --quiet --metrics "$out/gpt24_threads.jsonl" >"$out/gpt24_threads.log" 2>&1 || status=$?
  else skip gpt24_threads; fi
  for transport in ${GPU_GPT24_TRANSPORTS:-ucx nccl}; do
    t=$(within 120)
    if [ "$t" -eq 0 ]; then skip "gpt24_$transport"; continue; fi
    port=$(( 29500 + RANDOM % 1000 ))
    pids=()
    for r in 0 1; do
      RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        NCCL_HOSTID=pipetrain-bench-host-$r NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 \
        timeout -s KILL "$t" "$build/apps/pipetrain" train "$cfg" --quiet --set runtime.kind=processes \
        --set runtime.transport=$transport --metrics "$out/gpt24_$transport.r$r.jsonl" >"$out/gpt24_$transport.r$r.log" 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || status=1; done  # a bare wait would report 0 whatever they did
  done
  python3 - "$out" <<'EOF' >>"$out/gpt24_processes.jsonl"
import json, os, statistics, sys
out = sys.argv[1]
for run, path in [("threads", "gpt24_threads.jsonl"), ("processes_ucx", "gpt24_ucx.r0.jsonl"), ("processes_nccl", "gpt24_nccl.r0.jsonl")]:
    p = os.path.join(out, path)
    steps = []
    if os.path.exists(p):
        for line in open(p):
            j = json.loads(line)
            if "step_time_s" in j and j.get("step", 0) >= 3:
                steps.append(j["step_time_s"])
    print(json.dumps({"bench": "gpt24_2stages", "run": run, "steps": len(steps),
                      "step_ms_median": statistics.median(steps) * 1e3 if steps else None,
                      "step_ms_min": min(steps) * 1e3 if steps else None, "step_ms_max": max(steps) * 1e3 if steps else None}))
EOF
fi
# The default config (Fashion-MNIST, a CNN in 4 stages) trained on the GPU and, side by side, on
# this machine's CPU cores: wall time and test accuracy. The data travels in .gpu-deps.
root=$(cd "$(dirname "$0")/.." && pwd)
data=$root/.gpu-deps/root/usr/share/datasets/fashion-mnist
if part fashion && [ -x "$build/apps/pipetrain" ] && [ -d "$data" ]; then
  for devices in auto cpu; do
    t=$(within 240)
    if [ "$t" -eq 0 ]; then skip "fashion_$devices"; continue; fi
    start=$(date +%s%N)
    timeout "$t" "$build/apps/pipetrain" train "$root/configs/fashion_mnist_cnn.json" --set data.path="$data" \
      --set pipeline.devices="$devices" --metrics "$out/fashion_$devices.jsonl" >"$out/fashion_$devices.log" 2>&1 || status=$?
    printf '{"bench":"fashion_mnist_cnn","devices":"%s","wall_ms":%d,"tail":"%s"}\n' "$devices" \
      $(( ($(date +%s%N) - start) / 1000000 )) "$(tail -1 "$out/fashion_$devices.log" | tr -d '"\\')" >>"$out/fashion.jsonl"
  done
fi
machine after
exit $status
