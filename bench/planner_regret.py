#!/usr/bin/env python3
"""The auto-planner against measurement: for each config, a measured grid (`pipetrain bench`
over stage count, micro-batch count, schedule and recomputation mode, uniform balance, fp32)
and the planner's prediction for the same plans (`pipetrain plan --auto --json`). Prints, per
config, where the planner's pick ranks among the measured plans, its measured step against the
best measured step (the regret), and the Spearman rank correlation of predicted against
measured steps over the grid.

  python3 bench/planner_regret.py BUILD_DIR [CONFIG ...] > bench/results/planner_regret.md
"""
import json
import os
import subprocess
import sys
import tempfile

build = sys.argv[1] if len(sys.argv) > 1 else "build"
configs = sys.argv[2:] or ["configs/mlp_bench.json", "configs/gpt_small.json", "configs/fashion_mnist_cnn.json"]
binary = os.path.join(build, "apps", "pipetrain")
MBS = "2,4,8"
SCHEDULES = "gpipe,1f1b,zb-h1,zb-h2,dualpipev"
RECOMPUTE = "never,except_last"


def ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    r = [0.0] * len(values)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a, b):
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb)


def measure(config, out, stages, schedules):
    subprocess.run([binary, "bench", config, "--set", "pipeline.balance=uniform", "--stages", stages,
                    "--micro-batches", MBS, "--schedule", schedules, "--recompute", RECOMPUTE, "--json", out],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


print("# The auto-planner against measurement")
print()
print("`python3 bench/planner_regret.py build` on a 2-core machine; measured with `pipetrain bench` (median of")
print(f"10 steps), micro-batches {MBS}, schedules {SCHEDULES}, recompute {RECOMPUTE}, 1 and 2 stages (1: gpipe),")
print("uniform balance, fp32; predicted with `pipetrain plan --auto --devices 2 --json` on the same plans.")
print()
print("| config | plans | pick (predicted fastest) | pick's measured rank | pick measured | best measured | regret | Spearman |")
print("|---|---|---|---|---|---|---|---|")
for config in configs:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "grid.jsonl")
        measure(config, out, "1", "gpipe")
        measure(config, out, "2", SCHEDULES)
        measured = {}
        for line in open(out):
            j = json.loads(line)
            if "skipped" in j:
                continue
            key = (j["stages"], j["micro_batches"], j["schedule"], j["chunks"], j["recompute"])
            measured[key] = j["step_ms"]
    plans = subprocess.run([binary, "plan", config, "--auto", "--devices", "2", "--json"], check=True,
                           capture_output=True, text=True).stdout.splitlines()
    predicted = {}
    for line in plans:
        j = json.loads(line)
        if j["precision"] != "fp32" or j["balance_method"] != "uniform":
            continue
        key = (j["stages"], j["micro_batches"], j["schedule"], j["chunks"], j["recompute"])
        predicted[key] = j["step_ms"]
    keys = sorted(k for k in measured if k in predicted)
    pick = min(keys, key=lambda k: predicted[k])
    by_measured = sorted(keys, key=lambda k: measured[k])
    best = by_measured[0]
    rank = by_measured.index(pick) + 1
    rho = spearman([predicted[k] for k in keys], [measured[k] for k in keys])
    name = lambda k: f"K={k[0]} M={k[1]} {k[2]} {k[4]}"
    print(f"| {os.path.basename(config)} | {len(keys)} | {name(pick)} | {rank} of {len(keys)} | {measured[pick]:.1f} ms "
          f"(predicted {predicted[pick]:.1f}) | {measured[best]:.1f} ms ({name(best)}) | "
          f"{100 * (measured[pick] / measured[best] - 1):+.1f}% | {rho:.2f} |", flush=True)
