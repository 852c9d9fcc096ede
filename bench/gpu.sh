#!/usr/bin/env bash
# The GPU benchmarks (scripts/gpu.sh runs this after the gpu tests):
#   bash bench/gpu.sh BUILD_DIR RESULTS_DIR
# Writes RESULTS_DIR/machine.jsonl (the device, driver and clocks, read before and after) and
# RESULTS_DIR/transfers.jsonl (bench/transfer_gpu.cpp: two processes on the GPU, GB/s per transport,
# direction and size beside cudaMemcpy's), RESULTS_DIR/gpu_pipeline.jsonl (bench/gpu_pipeline.cpp: a 24-layer GPT, d_model 1024,
# sequence 1024, as the plain loop and as 1, 2 and 4 stages on the same GPU; peak memory per
# recomputation mode; the largest batch with and without recomputation), and fashion.jsonl (the
# default config trained on the GPU and on the CPU). Commit them under bench/results/gpu/.
set -uo pipefail
build=$1
out=$2
mkdir -p "$out"
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
if [ -x "$build/bench/transfer_gpu" ]; then
  timeout 240 "$build/bench/transfer_gpu" "$out/transfers.jsonl" >"$out/transfers.log" 2>&1 || status=$?
fi
timeout 300 "$build/bench/gpu_pipeline" "$out/gpu_pipeline.jsonl" ${GPU_PIPELINE_ARGS:-} || status=$?
# The default config (Fashion-MNIST, a CNN in 4 stages) trained on the GPU and, side by side, on
# this machine's CPU cores: wall time and test accuracy. The data travels in .gpu-deps.
root=$(cd "$(dirname "$0")/.." && pwd)
data=$root/.gpu-deps/root/usr/share/datasets/fashion-mnist
if [ -x "$build/apps/pipetrain" ] && [ -d "$data" ]; then
  for devices in auto cpu; do
    start=$(date +%s%N)
    timeout 240 "$build/apps/pipetrain" train "$root/configs/fashion_mnist_cnn.json" --set data.path="$data" \
      --set pipeline.devices="$devices" --metrics "$out/fashion_$devices.jsonl" >"$out/fashion_$devices.log" 2>&1 || status=$?
    printf '{"bench":"fashion_mnist_cnn","devices":"%s","wall_ms":%d,"tail":"%s"}\n' "$devices" \
      $(( ($(date +%s%N) - start) / 1000000 )) "$(tail -1 "$out/fashion_$devices.log" | tr -d '"\\')" >>"$out/fashion.jsonl"
  done
fi
machine after
exit $status
