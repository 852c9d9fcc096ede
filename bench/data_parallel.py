#!/usr/bin/env python3
"""Markdown tables from bench/data_parallel.sh's JSON lines:

  bench/data_parallel.py RESULTS.jsonl

per model and optimizer layout: for each stage count K and copy count D, the samples/s of the
pipeline (median, with the slowest and fastest timed step) against the plain one-thread loop and
the all-cores loop measured in the same run, the longest stage's reduction (median ms, its share
of the step, the share of it hidden behind compute), and the optimizer state one copy holds.
"""
import json
import sys

if len(sys.argv) != 2:
    sys.exit(__doc__)
rows = []
with open(sys.argv[1]) as f:
    for line in f:
        if line.strip():
            r = json.loads(line)
            if "skipped" in r:
                print(f"skipped: {r['config']['model']['family']} K={r['stages']} D={r['data_parallel']}: {r['skipped']}")
                continue
            rows.append(r)
if rows:
    m = rows[0]["machine"]
    print(f"Machine: {m['cpu']}, {m['cores']} cores; libtorch {m['libtorch']}; "
          f"{rows[0]['repeat']} timed steps after {rows[0]['warmup']} warm-up. Threads: the pipeline's "
          f"(stages x copies x intra-op threads each), against the plain loop with "
          f"{rows[0]['baseline_threads']} and with {rows[0]['baseline_all_cores_threads']} threads in the same run.\n")
groups = {}
for r in rows:
    key = (r["config"]["model"]["family"], r["config"]["optimizer"]["kind"], r.get("shard_optimizer", False))
    groups.setdefault(key, []).append(r)
for (family, optimizer, sharded), mine in groups.items():
    batch = mine[0]["batch_size"]
    print(f"#### {family}, batch {batch}, {optimizer}{', optimizer state sharded' if sharded else ''}\n")
    print("| K | D | threads | samples/s (min-max) | vs plain | vs plain, all cores | reduction ms | of the step | hidden | optimizer state per copy |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(mine, key=lambda r: (r["stages"], r["data_parallel"])):
        k, d = r["stages"], r["data_parallel"]
        lo, hi = r["pipeline_samples_per_s_range"]
        if d > 1:
            step = r["step_ms"]
            red = r["reduce_ms"]
            hidden = 1 - r["exposed_reduce_ms"] / red if red > 0 else 0
            reduction = f"{red:.1f} | {100 * red / step:.0f}% | {100 * max(0.0, hidden):.0f}%"
        else:
            reduction = "- | - | -"
        print(f"| {k} | {d} | {k * d * r['threads_per_stage']} | {r['pipeline_samples_per_s']:.0f} ({lo:.0f}-{hi:.0f}) | "
              f"{r['speedup']:.2f}x | {r['speedup_all_cores']:.2f}x | {reduction} | "
              f"{r['optimizer_state_bytes'] / 2**20:.2f} MiB |")
    print()
