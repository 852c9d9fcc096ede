#!/usr/bin/env python3
"""Markdown tables from a `pipetrain bench --json` sweep (bench/sweep.sh):

  bench/tables.py RESULTS.jsonl

per model: the best speedup over the one-thread loop for each stage and micro-batch count
(with the schedule and recomputation mode that gave it) next to the ideal, and the peak tensor
memory of a 2-stage step per schedule and recomputation mode at 8 micro-batches.
"""
import collections
import json
import sys

if len(sys.argv) != 2:
    sys.exit(__doc__)
rows = []
with open(sys.argv[1]) as f:
    for line in f:
        if line.strip():
            r = json.loads(line)
            if "skipped" not in r:
                r.setdefault("recompute", r.get("checkpoint"))  # sweeps before the key's rename
                rows.append(r)
models = sorted({r["config"]["model"]["family"] for r in rows})
for model in models:
    mine = [r for r in rows if r["config"]["model"]["family"] == model]
    print(f"\n#### {model}: best speedup over the one-thread loop (median of the timed steps)\n")
    ks = sorted({r["stages"] for r in mine})
    ms = sorted({r["micro_batches"] for r in mine})
    print("| M | " + " | ".join(f"K={k} (ideal)" for k in ks) + " |")
    print("|---|" + "---|" * len(ks))
    for m in ms:
        cells = []
        for k in ks:
            cand = [r for r in mine if r["stages"] == k and r["micro_batches"] == m]
            if not cand:
                cells.append("")
                continue
            best = max(cand, key=lambda r: r["speedup"])
            label = "" if k == 1 else f" {best['schedule']}, {best['recompute']}"
            cells.append(f"{best['speedup']:.2f}× ({k * m / (m + k - 1):.2f}×){label}")
        print(f"| {m} | " + " | ".join(cells) + " |")
    print(f"\n#### {model}: peak tensor memory of one step, 2 stages, 8 micro-batches (MiB)\n")
    print("| schedule | always | except_last | never |")
    print("|---|---|---|---|")
    plain = None
    for sched in ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1"):
        cells = []
        for ckpt in ("always", "except_last", "never"):
            cand = [r for r in mine if r["stages"] == 2 and r["micro_batches"] == 8 and r["schedule"] == sched
                    and r["recompute"] == ckpt]
            cells.append(f"{cand[0]['peak_tensor_bytes'] / 2**20:.1f}" if cand else "")
            if cand:
                plain = cand[0]["baseline_peak_tensor_bytes"] / 2**20
        print(f"| {sched} | " + " | ".join(cells) + " |")
    if plain is not None:
        print(f"| plain loop | | | {plain:.1f} |")
