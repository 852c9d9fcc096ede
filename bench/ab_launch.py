#!/usr/bin/env python3
"""Two pipetrain binaries side by side on a config whose ranks are processes: `pipetrain launch
--nproc N -- train CONFIG` by the old binary, then the new, alternately, REPEAT times; each run's
training samples/s (its final line), then the median and range over the runs, and new / old.

  bench/ab_launch.py OLD_BINARY NEW_BINARY CONFIG OUT.jsonl [NPROC]
  REPEAT=5 bench/ab_launch.py /tmp/old/build/apps/pipetrain build/apps/pipetrain \\
      bench/results/tied_processes_gpt.json bench/results/tied_processes_ab.jsonl

NPROC defaults to the config's pipeline.stages times pipeline.data_parallel. The machine's other
load is the noise: run it on an idle machine.
"""
import json
import os
import re
import statistics
import subprocess
import sys


def main():
    old, new, config, out = sys.argv[1:5]
    spec = json.load(open(config))
    pipe = spec.get("pipeline", {})
    nproc = int(sys.argv[5]) if len(sys.argv) > 5 else pipe.get("stages", 1) * pipe.get("data_parallel", 1)
    repeat = int(os.environ.get("REPEAT", 5))
    runs = {"old": [], "new": []}
    for i in range(repeat):
        for name, binary in (("old", old), ("new", new)):
            r = subprocess.run(["timeout", "600", binary, "launch", "--nproc", str(nproc), "--", "train",
                                os.path.abspath(config)], capture_output=True, text=True)
            m = re.search(r"steps in [0-9:]+, ([0-9.]+) samples/s", r.stdout + r.stderr)
            if not m:
                sys.exit(f"{name} run {i + 1}: no samples/s in its output:\n{(r.stdout + r.stderr)[-3000:]}")
            runs[name].append(float(m.group(1)))
            print(f"run {i + 1}/{repeat} {name}: {runs[name][-1]} samples/s", flush=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
    row = {"config": config, "nproc": nproc, "cpu": cpu, "cores": os.cpu_count(), "repeat": repeat}
    for name in ("old", "new"):
        row[f"{name}_samples_per_s"] = statistics.median(runs[name])
        row[f"{name}_range"] = [min(runs[name]), max(runs[name])]
        row[f"{name}_runs"] = runs[name]
    row["new_over_old"] = row["new_samples_per_s"] / row["old_samples_per_s"]
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
