#!/usr/bin/env python3
"""Two builds of pipetrain side by side on this machine's CPU, alternating in every round:
by default the last build on Debian's libtorch 1.13 with OpenBLAS (OLD) against PyTorch's own
2.11 from PyPI (NEW, MKL and oneDNN inside). Rows: the README's headline figures: the MLP bench
config, the best GPT row, the default Fashion-MNIST run, and plan/bench on its balance.

  python3 bench/libtorch.py OLD_BUILD NEW_BUILD [--repeat R] [--steps S] > bench/results/libtorch.md

Each figure is the median over R rounds (the builds alternate which runs first), with the
range; the ratio is NEW / OLD of the medians (below 1: NEW takes less time).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(binary, args):
    cmd = [os.path.join(binary, "apps", "pipetrain")] + args
    p = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"libtorch.py: {' '.join(cmd)} failed:\n{p.stdout}{p.stderr}")
    return p.stdout + p.stderr


def bench_rows(text):
    """single-device (1 thread), single-device (all cores), pipeline: median step in ms."""
    got = {}
    for line in text.splitlines():
        m = re.match(r"^(single-device, all cores|single-device|pipeline)\s+\S+\s+([0-9.]+) ms", line)
        if m:
            got[m.group(1)] = float(m.group(2))
    return got


def workloads(steps):
    mlp = ["bench", "configs/mlp_bench.json"]
    gpt = ["bench", "configs/gpt_small.json", "--set", "pipeline.micro_batches=2", "--set",
           "pipeline.schedule=zb-h1", "--set", "pipeline.checkpoint=never"]

    def from_bench(args, prefix):
        def measure(binary):
            r = bench_rows(run(binary, args))
            return {f"{prefix}: plain loop, 1 thread (ms)": r["single-device"],
                    f"{prefix}: plain loop, all cores (ms)": r["single-device, all cores"],
                    f"{prefix}: pipeline step (ms)": r["pipeline"]}
        return measure

    def fashion(binary):
        args = ["train", "configs/fashion_mnist_cnn.json", "--quiet"]
        if steps:
            args += ["--steps", str(steps)]
        t0 = time.monotonic()
        text = run(binary, args)
        wall = time.monotonic() - t0
        sps = re.search(r"([0-9.]+) samples/s in training", text)
        acc = re.search(r"test accuracy ([0-9.]+)", text)
        return {"Fashion-MNIST default run: training samples/s": float(sps.group(1)),
                "Fashion-MNIST default run: wall time (s)": wall,
                "Fashion-MNIST default run: test accuracy": float(acc.group(1))}

    def plan(binary):
        text = run(binary, ["plan", "configs/fashion_mnist_cnn.json"])
        predicted = float(re.search(r"predicted step ([0-9.]+) ms", text).group(1))
        measured = bench_rows(run(binary, ["bench", "configs/fashion_mnist_cnn.json",
                                           "--set", "pipeline.balance=time"]))["pipeline"]
        return {"CNN plan (balance time): predicted step (ms)": predicted,
                "CNN bench (balance time): measured step (ms)": measured}

    return [from_bench(mlp, "MLP bench config"), from_bench(gpt, "GPT small, 2 stages, M=2, zb-h1"),
            fashion, plan]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=0, help="Fashion-MNIST steps (0: the config's)")
    ap.add_argument("--old-label", default="Debian's libtorch 1.13.1, OpenBLAS 0.3.21 (openmp)")
    a = ap.parse_args()
    builds = {"old": a.old, "new": a.new}
    results = {"old": {}, "new": {}}
    for rnd in range(a.repeat):
        order = ["old", "new"] if rnd % 2 == 0 else ["new", "old"]
        for w in workloads(a.steps):
            for which in order:
                for k, v in w(builds[which]).items():
                    results[which].setdefault(k, []).append(v)
        print(f"round {rnd + 1}/{a.repeat} done", file=sys.stderr)

    def version(binary):
        return run(binary, ["--version"]).splitlines()[0:2]

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"# {time.strftime('%Y-%m-%d')}, {cpu}, {os.cpu_count()} cores; {a.repeat} rounds, builds alternating")
    print(f"# OLD {a.old}: {a.old_label}")
    print(f"# NEW {a.new}: {' / '.join(version(a.new))}")
    print()
    print("| figure | OLD median (range) | NEW median (range) | NEW / OLD |")
    print("|---|---|---|---|")
    for k in results["old"]:
        o, n = results["old"][k], results["new"][k]
        mo, mn = statistics.median(o), statistics.median(n)
        fmt = (lambda x: f"{x:.4f}") if "accuracy" in k else (lambda x: f"{x:.1f}")
        print(f"| {k} | {fmt(mo)} ({fmt(min(o))}–{fmt(max(o))}) | {fmt(mn)} ({fmt(min(n))}–{fmt(max(n))}) | "
              f"{mn / mo:.2f} |")


if __name__ == "__main__":
    main()
