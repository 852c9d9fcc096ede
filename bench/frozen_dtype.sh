#!/usr/bin/env bash
# model.frozen_dtype on this machine's CPU: a LoRA language model (a layer list: 6 llama_blocks of
# d_model 512 with rank-16 adapters on every projection, the projections and the head frozen;
# batch 16 x 128 tokens, 2 stages x 4 micro-batches, 1F1B, bf16) with its frozen weights in
# float32 and in bfloat16, side by side:
#   - the predicted peak memory of each stage (`pipetrain plan --json`, from the profile), and
#   - the pipeline's and the plain loop's samples/s, the measured peak tensor bytes of each stage and
#     of the whole step (`pipetrain bench`), ROUNDS alternating rounds, the medians and ranges.
#   bash bench/frozen_dtype.sh BUILD_DIR [ROUNDS] [OUT.jsonl]
set -euo pipefail
build=${1:?usage: bench/frozen_dtype.sh BUILD_DIR [ROUNDS] [OUT.jsonl]}
rounds=${2:-3}
out=${3:-}
bin=$build/apps/pipetrain
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'EOF'
import json, sys
work = sys.argv[1]
ids = bytearray()
for i in range(200000):
    ids += ((i * 7 + i // 13) % 4096).to_bytes(2, "little")
open(f"{work}/tokens.bin", "wb").write(ids)
block = lambda n: {"name": n, "type": "llama_block", "d_model": 512, "n_heads": 8, "n_kv_heads": 4, "d_ff": 1376,
                   "lora_rank": 16, "lora_alpha": 32, "lora_targets": "all"}
config = {
    "model": {"family": "layers", "input_shape": [128], "input_dtype": "long",
              "layers": [{"name": "e", "type": "embedding", "num_embeddings": 4096, "embedding_dim": 512}]
                        + [block(f"b{i}") for i in range(6)]
                        + [{"name": "n", "type": "rmsnorm", "normalized_shape": 512},
                           {"name": "head", "type": "linear", "in_features": 512, "out_features": 4096, "bias": False}],
              "freeze": ["e.*", "b*_proj.weight", "head.*"]},
    "data": {"kind": "tokens", "path": f"{work}/tokens.bin", "dtype": "uint16", "batch_size": 16, "stride": 128},
    "pipeline": {"stages": 2, "micro_batches": 4, "schedule": "1f1b"},
    "optimizer": {"kind": "adamw", "lr": 1e-3},
    "train": {"steps": 10, "precision": "bf16"},
}
json.dump(config, open(f"{work}/lora.json", "w"), indent=1)
EOF
for frozen in fp32 bf16; do
  "$bin" plan "$work/lora.json" --set model.frozen_dtype=$frozen --json >"$work/plan_$frozen.json"
done
for ((r = 0; r < rounds; r++)); do
  for frozen in fp32 bf16; do
    "$bin" bench "$work/lora.json" --set model.frozen_dtype=$frozen --warmup 2 --repeat 5 --min-time 0 \
      --json "$work/bench_$frozen.jsonl" >/dev/null
  done
done
python3 - "$work" "$rounds" "$out" <<'EOF'
import json, statistics, sys
work, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
lines = []
for frozen in ("fp32", "bf16"):
    plan = json.load(open(f"{work}/plan_{frozen}.json"))
    runs = [json.loads(l) for l in open(f"{work}/bench_{frozen}.jsonl")]
    line = {"bench": "frozen_dtype", "frozen_dtype": frozen, "rounds": rounds, "cpu": cpu,
            "plan_stage_param_bytes": [s["param_bytes"] for s in plan["stages"]],
            "plan_stage_peak_bytes": [s["peak_memory_bytes"] for s in plan["stages"]]}
    for key in ("pipeline_samples_per_s", "baseline_samples_per_s", "peak_tensor_bytes", "baseline_peak_tensor_bytes"):
        v = [r[key] for r in runs if r.get(key) is not None]
        if v:
            line[key + "_median"] = statistics.median(v)
            line[key + "_range"] = [min(v), max(v)]
    per_stage = [r["device_peak_bytes"] for r in runs if r.get("device_peak_bytes")]
    if per_stage:
        line["stage_peak_bytes_median"] = [statistics.median(s[d] for s in per_stage) for d in range(len(per_stage[0]))]
    lines.append(line)
for l in lines:
    print(json.dumps(l))
    if out:
        open(out, "a").write(json.dumps(l) + "\n")
EOF
