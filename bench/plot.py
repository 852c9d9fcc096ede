#!/usr/bin/env python3
"""Turns `pipetrain bench --json` sweep results into PNG plots with gnuplot.

  bench/plot.py RESULTS.jsonl OUT_DIR [--trace TRACE.json]

For each model in the results:
  speedup_<model>.png  pipeline samples/s over the one-thread loop against micro-batches, one
                       line per stage count and schedule (no recomputation), with the ideal
                       K*M/(M+K-1) drawn beside them;
  memory_<model>.png   peak tensor memory of a step against micro-batches, one line per
                       recomputation mode (2 stages, gpipe and 1f1b), and the plain loop's.
With --trace, timeline.png draws the spans of a `pipetrain train --trace` file, one row per
stage. Needs gnuplot (Debian: gnuplot-nox).
"""
import collections
import json
import os
import subprocess
import sys
import tempfile


def load(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON: {e}")
    for r in rows:
        r.setdefault("recompute", r.get("checkpoint"))  # sweeps before the key's rename
    return [r for r in rows if "skipped" not in r]


def model_name(row):
    return row["config"]["model"]["family"]


def gnuplot(script):
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


def write_data(path, points):
    with open(path, "w") as f:
        for x, y in points:
            f.write(f"{x} {y}\n")


DATA = tempfile.mkdtemp(prefix="pipetrain_plot_")  # gnuplot's data files; only the PNGs are kept


def plot_against_micro_batches(png, title, ylabel, lines, extra=()):
    """Draws `lines` ({title: [(M, y)]}, with points) and `extra` gnuplot plot terms (dashed
    references) against the micro-batch count on a log2 axis."""
    plots = []
    for i, (name, pts) in enumerate(lines.items()):
        dat = os.path.join(DATA, f"{os.path.basename(png)}.{i}.dat")
        write_data(dat, sorted(pts))
        plots.append(f"'{dat}' using 1:2 with linespoints title '{name}'")
    plots.extend(extra)
    gnuplot(f"""set terminal png size 900,560 noenhanced
set output '{png}'
set title '{title}'
set xlabel 'micro-batches M'
set ylabel '{ylabel}'
set logscale x 2
set xrange [0.8:40]
set yrange [0:*]
set key outside right
set grid
plot {', '.join(plots)}
""")
    return png


def speedup_plot(rows, model, out_dir):
    series = collections.defaultdict(list)
    for r in rows:
        if r["recompute"] != "never" or r["stages"] == 1:
            continue
        series[(r["stages"], r["schedule"])].append((r["micro_batches"], r["speedup"]))
    if not series:
        return None
    lines = {f"K={k} {sched}": pts for (k, sched), pts in sorted(series.items())}
    ideal = [f"{k}*x/(x+{k}-1) with lines dashtype 2 lw 2 title 'ideal K={k}'" for k in sorted({k for k, _ in series})]
    return plot_against_micro_batches(os.path.join(out_dir, f"speedup_{model}.png"),
                                      f"pipetrain {model}: pipeline samples/s over the one-thread loop (no recomputation)",
                                      "speedup", lines, ideal)


def memory_plot(rows, model, out_dir):
    series = collections.defaultdict(list)
    base = {}
    for r in rows:
        if r["stages"] != 2 or r["schedule"] not in ("gpipe", "1f1b"):
            continue
        series[(r["schedule"], r["recompute"])].append((r["micro_batches"], r["peak_tensor_bytes"] / 2**20))
        base[r["micro_batches"]] = r["baseline_peak_tensor_bytes"] / 2**20
    if not series:
        return None
    lines = {f"{sched}, recompute {ckpt}": pts for (sched, ckpt), pts in sorted(series.items())}
    lines["plain loop"] = list(base.items())
    return plot_against_micro_batches(os.path.join(out_dir, f"memory_{model}.png"),
                                      f"pipetrain {model}: peak tensor memory of a step, 2 stages",
                                      "MiB (all stages)", lines)


def timeline_plot(trace_path, out_dir):
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    colors = {"forward": "#4e79a7", "backward": "#e15759", "backward_input": "#e15759",
              "backward_weight": "#f28e2b", "recompute": "#76b7b2", "optimizer": "#59a14f",
              "idle": "#dddddd"}
    spans = [e for e in events if e.get("ph") == "X" and e.get("pid") == 0]
    if not spans:
        sys.exit(f"{trace_path}: no spans")
    t0 = min(e["ts"] for e in spans)
    objects = []
    stages = sorted({e["tid"] for e in spans})
    for e in spans:
        cat = e.get("cat", "")
        if cat.startswith("send") or cat.startswith("recv"):
            continue  # instantaneous on the local transport, or waiting: shown as gaps
        color = colors.get(cat, "#999999")
        x0 = (e["ts"] - t0) / 1000.0
        x1 = x0 + e["dur"] / 1000.0
        y = e["tid"]
        objects.append(f"set object rect from {x0},{y - 0.4} to {x1},{y + 0.4} fc rgb '{color}' fs solid 1.0 noborder")
    png = os.path.join(out_dir, "timeline.png")
    end = max((e["ts"] + e["dur"] - t0) / 1000.0 for e in spans)
    keys = "\n".join(
        f"set label '{name}' at graph {0.02 + 0.14 * i}, graph 1.06 textcolor rgb '{c}'"
        for i, (name, c) in enumerate([("forward", colors["forward"]), ("backward", colors["backward"]),
                                       ("W", colors["backward_weight"]), ("recompute", colors["recompute"]),
                                       ("optimizer", colors["optimizer"]), ("idle", "#aaaaaa")]))
    gnuplot(f"""set terminal png size 1100,{160 + 70 * len(stages)} noenhanced
set output '{png}'
set title 'measured step: {os.path.basename(trace_path)}' offset 0,1
set xlabel 'ms'
set ytics ({', '.join(f'"stage {s}" {s}' for s in stages)})
set yrange [{len(stages) - 0.5}:-0.5]
set xrange [0:{end}]
{keys}
{chr(10).join(objects)}
plot NaN notitle
""")
    return png


def main():
    args = sys.argv[1:]
    trace = None
    if "--trace" in args:
        i = args.index("--trace")
        trace = args[i + 1]
        del args[i:i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    results, out_dir = args
    os.makedirs(out_dir, exist_ok=True)
    rows = load(results)
    for model in sorted({model_name(r) for r in rows}):
        mine = [r for r in rows if model_name(r) == model]
        for png in (speedup_plot(mine, model, out_dir), memory_plot(mine, model, out_dir)):
            if png:
                print(png)
    if trace:
        print(timeline_plot(trace, out_dir))


if __name__ == "__main__":
    main()
