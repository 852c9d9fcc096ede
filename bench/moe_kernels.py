#!/usr/bin/env python3
"""A mixture of experts' two kernels side by side (llama_block experts_kernel "loop" and
"grouped"): `pipetrain bench` of bench/moe_kernels.json (4 Llama blocks of 8 experts, top 2, on
2 stages) with each kernel in turn, in float32 and bf16, REPEAT rounds; the pipeline's and the
plain loop's samples/s (each run's median over its timed steps), then the median and range over
the rounds, and grouped / loop.

  bench/moe_kernels.py BINARY OUT.jsonl
  REPEAT=5 REPS=8 bench/moe_kernels.py build/apps/pipetrain bench/results/moe_kernels.jsonl
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_speed import bench, cpu, side_by_side  # noqa: E402

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe_kernels.json")


def main():
    binary, out = sys.argv[1:3]
    repeat, reps = int(os.environ.get("REPEAT", 5)), int(os.environ.get("REPS", 8))
    precisions, kernels = ("fp32", "bf16"), ("loop", "grouped")
    runs = {(p, k): [] for p in precisions for k in kernels}
    for i in range(repeat):
        for p in precisions:
            for k in kernels:
                spec = f"{CONFIG}:model.layers.1.layers.0.experts_kernel={k},train.precision={p}"
                runs[(p, k)].append(bench(binary, spec, reps))
                print(f"run {i + 1}/{repeat} {p} {k}: pipeline {runs[(p, k)][-1][0]:.1f}, "
                      f"plain loop {runs[(p, k)][-1][1]:.1f} samples/s", flush=True)
    with open(out, "w") as f:
        for p in precisions:
            row = {"config": "bench/moe_kernels.json", "precision": p, "cpu": cpu(), "cores": os.cpu_count(), "repeat": repeat}
            for what, i in (("pipeline", 0), ("plain_loop", 1)):
                side_by_side(row, what, {k: runs[(p, k)] for k in kernels}, i, kernels)
            f.write(json.dumps(row) + "\n")
            print(f"{p}: pipeline {row['pipeline_loop_samples_per_s']:.1f} -> {row['pipeline_grouped_samples_per_s']:.1f} "
                  f"({row['pipeline_grouped_over_loop']:.2f}x), plain loop {row['plain_loop_loop_samples_per_s']:.1f} -> "
                  f"{row['plain_loop_grouped_samples_per_s']:.1f} ({row['plain_loop_grouped_over_loop']:.2f}x)")


if __name__ == "__main__":
    main()
