#!/usr/bin/env python3
"""Does `plan --auto` ever make a user slower than not pipelining? For each config: the
planner's pick on this machine's cores (`plan --auto --write-config`), then, in alternating
rounds, `bench` on the shipped config and on the pick; each bench also times the plain loop on
every core ("single-device, all cores") in the same run. Prints per config the medians (samples/s)
and the pick over the best of the plain loop and the shipped config (goal: >= 0.95).

  python3 bench/planner_pick.py BUILD_DIR [--rounds R] [CONFIG[:--set k=v,...] ...]

Configs default to every shipped one plus two of the same families that are not shipped
(written as overrides of shipped ones, so the planner has never been tuned on them).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

SHIPPED = ["configs/mlp_bench.json", "configs/gpt_small.json", "configs/fashion_mnist_cnn.json",
           "configs/gpt_text.json", "configs/lenet5_fashion_mnist.json", "configs/resnet_fashion_mnist.json",
           "configs/unet_fashion_mnist.json"]
HIDDEN = ["configs/mlp_bench.json:model.in=784,model.width=1536,model.layers=5,data.batch_size=128,pipeline.balance=time",
          "configs/gpt_small.json:model.d_model=96,model.n_layers=6,model.seq_len=48,data.batch_size=24"]


def run(binary, args):
    p = subprocess.run([binary] + args, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        sys.exit(f"planner_pick.py: {' '.join(args)} failed:\n{p.stdout}{p.stderr}")
    return p.stdout


def rates(text):
    """bench's rows: {name: samples/s}."""
    got = {}
    for line in text.splitlines():
        m = re.match(r"^(single-device, all cores|single-device|pipeline)\s+\S+\s+[0-9.]+ ms\s+([0-9.]+)", line)
        if m:
            got[m.group(1)] = float(m.group(2))
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("configs", nargs="*")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    binary = os.path.join(a.build, "apps", "pipetrain")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for spec in a.configs or SHIPPED + HIDDEN:
            path, _, sets = spec.partition(":")
            overrides = [x for kv in sets.split(",") if kv for x in ("--set", kv)]
            pick = os.path.join(d, "pick.json")
            plan = run(binary, ["plan", path, "--auto", "--top", "1", "--write-config", pick] + overrides)
            chosen = next((l[len("chosen: "):] for l in plan.splitlines() if l.startswith("chosen: ")), "?")
            plain_line = next((l for l in plan.splitlines() if l.startswith("the plain loop")), "")
            m = re.search(r"([0-9]+) samples/s predicted", plain_line)
            predicted_pick = re.search(r"^1\s+.*?([0-9.]+)\s+[0-9.]+\s+[0-9.]+%", plan, re.M)
            got = {"shipped": [], "pick": [], "plain": []}
            for r in range(a.rounds):
                order = [("shipped", [path] + overrides), ("pick", [pick])]
                for who, args in (order if r % 2 == 0 else order[::-1]):
                    out = rates(run(binary, ["bench"] + args))
                    got[who].append(out["pipeline"])
                    got["plain"].append(out["single-device, all cores"])
            med = {k: statistics.median(v) for k, v in got.items()}
            best = max(med["plain"], med["shipped"])
            name = os.path.basename(path) + (f" ({sets})" if sets else "")
            rows.append(f"| {name} | {chosen} | {predicted_pick.group(1) if predicted_pick else '?'} | "
                        f"{med['pick']:.0f} ({min(got['pick']):.0f}-{max(got['pick']):.0f}) | "
                        f"{med['plain']:.0f} ({min(got['plain']):.0f}-{max(got['plain']):.0f}) | "
                        f"{med['shipped']:.0f} | {med['pick'] / best:.2f} |")
            print(rows[-1], flush=True)
    print("\n| config | pick | pick predicted | pick measured | plain loop, all cores | shipped config | pick / best of the two |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
