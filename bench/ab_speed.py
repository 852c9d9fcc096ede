#!/usr/bin/env python3
"""Two pipetrain binaries side by side: `pipetrain bench` of each config by the old binary, then
the new, alternately, REPEAT times; the pipeline's and the plain loop's samples/s (each run's
median over its timed steps), then the median and range over the runs, and new / old.

  bench/ab_speed.py OLD_BINARY NEW_BINARY OUT.jsonl [CONFIG[:key=value,...] ...]
  REPEAT=5 REPS=12 bench/ab_speed.py /work/old/build/apps/pipetrain build/apps/pipetrain r.jsonl

A config may carry overrides after a colon (`bench --set` each). Default configs:
configs/gpt_text.json, configs/gpt_small.json, configs/mlp_bench.json. The machine's other load
is the noise: run it on an idle machine.
"""
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile


def bench(binary, spec, reps):
    config, _, sets = spec.partition(":")
    overrides = [x for kv in sets.split(",") if kv for x in ("--set", kv)]
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as out:
        subprocess.run([binary, "bench", config, "--warmup", "3", "--repeat", str(reps), "--min-time", "0",
                        "--json", out.name] + overrides, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = json.loads(open(out.name).readline())
    return r["pipeline_samples_per_s"], r["baseline_samples_per_s"], r["baseline_all_cores_samples_per_s"]


def side_by_side(row, what, runs, index, names):
    """Into row: the median and range of each of the two names' runs (their index-th figure), as
    <what>_<name>_samples_per_s and <what>_<name>_range, and <what>_<second>_over_<first>."""
    for name in names:
        v = [r[index] for r in runs[name]]
        row[f"{what}_{name}_samples_per_s"] = statistics.median(v)
        row[f"{what}_{name}_range"] = [min(v), max(v)]
    a, b = names
    row[f"{what}_{b}_over_{a}"] = row[f"{what}_{b}_samples_per_s"] / row[f"{what}_{a}_samples_per_s"]


def cpu():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    old, new, out = sys.argv[1:4]
    configs = sys.argv[4:] or ["configs/gpt_text.json", "configs/gpt_small.json", "configs/mlp_bench.json"]
    repeat, reps = int(os.environ.get("REPEAT", 5)), int(os.environ.get("REPS", 12))
    runs = {(c, b): [] for c in configs for b in ("old", "new")}
    for i in range(repeat):
        for c in configs:
            for name, binary in (("old", old), ("new", new)):
                runs[(c, name)].append(bench(binary, c, reps))
                print(f"run {i + 1}/{repeat} {c} {name}: pipeline {runs[(c, name)][-1][0]:.1f}, "
                      f"plain loop {runs[(c, name)][-1][1]:.1f}, on all cores {runs[(c, name)][-1][2]:.1f} samples/s",
                      flush=True)
    with open(out, "w") as f:
        for c in configs:
            row = {"config": c, "cpu": cpu(), "cores": os.cpu_count(), "repeat": repeat}
            for what, k in (("pipeline", 0), ("plain_loop", 1), ("plain_loop_all_cores", 2)):
                side_by_side(row, what, {n: runs[(c, n)] for n in ("old", "new")}, k, ("old", "new"))
            f.write(json.dumps(row) + "\n")
            print(f"{c}: pipeline {row['pipeline_old_samples_per_s']:.1f} -> {row['pipeline_new_samples_per_s']:.1f} "
                  f"({row['pipeline_new_over_old']:.2f}x), plain loop {row['plain_loop_old_samples_per_s']:.1f} -> "
                  f"{row['plain_loop_new_samples_per_s']:.1f} ({row['plain_loop_new_over_old']:.2f}x), on all cores "
                  f"{row['plain_loop_all_cores_old_samples_per_s']:.1f} -> {row['plain_loop_all_cores_new_samples_per_s']:.1f}")


if __name__ == "__main__":
    main()
