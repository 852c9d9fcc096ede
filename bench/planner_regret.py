#!/usr/bin/env python3
"""The auto-planner against measurement. For each config, a measured grid (`pipetrain bench`
over stage count, data-parallel copies, micro-batch count, schedule, recomputation mode,
balance and precision with one thread per stage and copy on 2 cores, and the plain loop on both
cores) and the planner's prediction for the same plans (`pipetrain plan --auto --cores 2 --json`). Prints, per config:

- speed: where the planner's pick ranks among the measured plans, its measured step against
  the best measured step (the regret), and the Spearman rank correlation of predicted against
  measured steps over the grid;
- memory: each measured plan's peak per device (its tensors, parameters and optimizer state)
  against the planner's prediction; a tight limit (just below what the least hungry plan
  without recomputation or 1F1B needs): the planner's pick under it, measured, must stay under
  it; and limits swept over the predicted peaks, each pick measured against its limit.

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
MBS = "2,8"
SCHEDULES = "gpipe,1f1b,zb-h1,dualpipev"
RECOMPUTE = "never,except_last"


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# bf16 only where the CPU computes it (AVX-512 BF16 or AMX): elsewhere libtorch emulates it, a
# step takes about 20x as long, no plan in bf16 comes near the fastest, and measuring them all
# would take hours. PLANNER_REGRET_PRECISIONS overrides.
PRECISIONS = os.environ.get("PLANNER_REGRET_PRECISIONS") or (
    "fp32,bf16" if cpu_flags() & {"avx512_bf16", "amx_bf16"} else "fp32")
MIB = 1 << 20
HEADROOM = 0.05  # plan --auto --memory-headroom's default
RUNS = 3  # passes over the grid
SWEEP = (0, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1)  # quantiles of the predicted peaks


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


def bench(config, out, *args, mbs=MBS):
    subprocess.run([binary, "bench", config, "--recompute", RECOMPUTE, "--micro-batches", mbs,
                    "--warmup", "2", "--repeat", "6", "--json", out, *args],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def key_of(j, balance, threads=None):
    return (j["stages"], j.get("data_parallel", 1), j.get("shard_optimizer", False), j["micro_batches"], j["schedule"],
            j["chunks"], j["recompute"], j["precision"], balance, threads if threads is not None else j.get("threads", 1))


def name(k):
    copies = f" D={k[1]}{'z' if k[2] else ''}" if k[1] > 1 else ""
    threads = f" T={k[9]}" if k[9] > 1 else ""
    return f"K={k[0]}{copies}{threads} M={k[3]} {k[4]} {k[6]} {k[7]} {k[8]}"


def measure_grid(config, d):
    """Every plan of the grid: {key: bench JSON line}."""
    measured = {}
    for balance in ("uniform", "time"):
        out = os.path.join(d, f"grid_{balance}.jsonl")
        common = ["--set", f"pipeline.balance={balance}", "--set", "runtime.intra_op_threads=1"]
        if balance == "uniform":  # one stage splits nothing: measured once; both precisions
            common += ["--precision", PRECISIONS]
            bench(config, out, *common, "--stages", "1", "--data-parallel", "1,2", "--schedule", "gpipe")
        bench(config, out, *common, "--stages", "2", "--schedule", SCHEDULES)
        for line in open(out):
            j = json.loads(line)
            if "skipped" not in j:
                measured[key_of(j, balance, 1)] = j
    # The plain loop on both cores: one stage of 2 intra-op threads.
    out = os.path.join(d, "grid_plain.jsonl")
    bench(config, out, "--set", "pipeline.balance=uniform", "--set", "runtime.intra_op_threads=2", "--precision",
          PRECISIONS, "--stages", "1", "--data-parallel", "1", "--schedule", "gpipe", mbs="1," + MBS)
    for line in open(out):
        j = json.loads(line)
        if "skipped" not in j:
            measured[key_of(j, "uniform", 2)] = j
    return measured


def auto_plans(config, *args):
    lines = subprocess.run([binary, "plan", config, "--auto", "--cores", "2", "--json", *args],
                           check=True, capture_output=True, text=True).stdout.splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


print("# The auto-planner against measurement")
print()
def machine():
    """The CPU's model name, core count and whether it has AMX (bf16's speed depends on it)."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {'AMX' if 'amx_bf16' in cpu_flags() else 'no AMX'}"


print(f"`python3 bench/planner_regret.py build` on {machine()}. Measured with `pipetrain bench` (median of")
print(f"6 steps after 2 of warm-up, one thread per stage and copy, or T=2: the plain loop on both cores; the grid")
print(f"measured {RUNS} times, one pass after another, each plan's step the median of its passes): 1 stage (1 or 2")
print("copies, gpipe; or 1 copy of 2 threads, also at M=1) and 2 stages")
print(f"(schedules {SCHEDULES}), micro-batches {MBS}, recompute {RECOMPUTE}, precisions {PRECISIONS} with the uniform")
print("balance and fp32 with the time balance (2 stages);")
print("predicted with `pipetrain plan --auto --cores 2 --json` on the same plans. Peak memory per device: the")
print("tensors its stage allocated in a step (a counting allocator, by thread) plus its parameters and optimizer state.")
print()
speed_rows, memory_rows, limit_rows, sweep_rows = [], [], [], []
for config in configs:
    with tempfile.TemporaryDirectory() as d:
        # The grid measured RUNS times, one whole pass after another (this machine's noise drifts
        # over minutes): each plan's step is the median of its passes' medians.
        passes = [measure_grid(config, d) for _ in range(RUNS)]
        measured = {k: dict(passes[0][k], step_ms=sorted(p[k]["step_ms"] for p in passes)[RUNS // 2])
                    for k in passes[0] if all(k in p for p in passes)}
        plans = auto_plans(config)
        predicted = {}
        for j in plans:
            if j["balance_method"] in ("uniform", "time"):
                predicted[key_of(j, j["balance_method"])] = j
        keys = sorted(k for k in measured if k in predicted and not (k[0] == 1 and k[8] == "time"))
        step = lambda k: measured[k]["step_ms"]
        pick = min(keys, key=lambda k: predicted[k]["step_ms"])
        by_measured = sorted(keys, key=step)
        best = by_measured[0]
        rho = spearman([predicted[k]["step_ms"] for k in keys], [step(k) for k in keys])
        pass_ranks = [sorted(keys, key=lambda k, p=p: p[k]["step_ms"]).index(pick) + 1 for p in passes]
        cfg = os.path.basename(config)
        speed_rows.append(f"| {cfg} | {len(keys)} | {name(pick)} | {by_measured.index(pick) + 1} of {len(keys)} | "
                          f"{', '.join(map(str, pass_ranks))} | "
                          f"{step(pick):.1f} ms (predicted {predicted[pick]['step_ms']:.1f}) | {step(best):.1f} ms "
                          f"({name(best)}) | {100 * (step(pick) / step(best) - 1):+.1f}% | {rho:.2f} |")

        # Memory: measured peak per device against predicted, over the grid.
        ratios = []
        for k in keys:
            for dev, (got, want) in enumerate(zip(measured[k]["device_peak_bytes"], predicted[k]["peak_bytes"])):
                ratios.append((got / want, f"{name(k)}, device {dev}: {got / MIB:.2f} MiB against {want / MIB:.2f}"))
        ratios.sort()
        over = sum(r > 1 for r, _ in ratios)
        memory_rows.append(f"| {cfg} | {len(ratios)} | {ratios[0][0]:.2f} | {ratios[len(ratios) // 2][0]:.2f} | "
                           f"{ratios[-1][0]:.2f} ({ratios[-1][1]}) | {over} |")

        def pick_under(limit):
            """The planner's pick under `limit`, written as a config and measured: (pick, peak)."""
            chosen = os.path.join(d, "chosen.json")
            top = auto_plans(config, "--memory-limit", str(limit), "--write-config", chosen)[0]
            out = os.path.join(d, "chosen.jsonl")
            if os.path.exists(out):
                os.remove(out)
            subprocess.run([binary, "bench", chosen, "--warmup", "2", "--repeat", "6", "--json", out], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return top, max(json.loads(open(out).readline())["device_peak_bytes"])

        # A tight limit: just below what the least hungry plan without recomputation or 1F1B
        # needs (its predicted peak with the planner's default headroom of 5% kept free).
        free = [j for j in plans if j["recompute"] == "never" and j["schedule"] != "1f1b"]
        limit = int(min(max(j["peak_bytes"]) for j in free) / (1 - HEADROOM)) - 1
        top, peak = pick_under(limit)
        tk = key_of(top, top["balance_method"])
        limit_rows.append(f"| {cfg} | {limit / MIB:.2f} | {name(tk)} | {max(top['peak_bytes']) / MIB:.2f} | "
                          f"{peak / MIB:.2f} | {'yes' if peak <= limit else 'NO'} |")

        # Limits swept: each just large enough for a plan at a quantile of the predicted peaks
        # (with the headroom), from the least hungry plan up; every pick measured against its limit.
        peaks = sorted({max(j["peak_bytes"]) for j in plans})
        limits = sorted({int(peaks[int(q * (len(peaks) - 1))] / (1 - HEADROOM)) + 1 for q in SWEEP})
        worst, over = (0.0, ""), 0
        for lim in limits:
            top, peak = pick_under(lim)
            what = (f"{name(key_of(top, top['balance_method']))} under {lim / MIB:.2f} MiB: predicted "
                    f"{max(top['peak_bytes']) / MIB:.2f}, measured {peak / MIB:.2f}")
            worst = max(worst, (peak / lim, what))
            over += peak > lim
        sweep_rows.append(f"| {cfg} | {len(limits)} ({limits[0] / MIB:.2f} to {limits[-1] / MIB:.2f} MiB) | "
                          f"{worst[0]:.3f} ({worst[1]}) | {over} |")
    print(f"done: {cfg}", file=sys.stderr, flush=True)

print("## Speed\n")
print("| config | plans | pick (predicted fastest) | pick's measured rank | its rank in each pass | pick measured | best measured | regret | Spearman |")
print("|---|---|---|---|---|---|---|---|---|")
print("\n".join(speed_rows))
print("\n## Memory per device, measured / predicted\n")
print("| config | devices x plans | min | median | max (its plan) | measured above predicted |")
print("|---|---|---|---|---|---|")
print("\n".join(memory_rows))
print("\n## Under a tight limit (MiB per device)\n")
print("The limit is 1 byte below the least any plan without recomputation or 1F1B needs with the planner's")
print("default headroom (5% of the limit kept free), so none of those fits; the pick is written with")
print("`--write-config` and measured with `bench` on that config.\n")
print("| config | limit | pick | predicted peak | measured peak | within the limit |")
print("|---|---|---|---|---|---|")
print("\n".join(limit_rows))
print("\n## Limits swept\n")
print("Limits just large enough (with the headroom) for the plans at quantiles " + ", ".join(map(str, SWEEP)))
print("of the predicted peaks, the least hungry plan first; each pick written, measured with `bench`, and its")
print("measured peak per device compared with the limit.\n")
print("| config | limits | largest measured peak / limit (its pick) | picks over their limit |")
print("|---|---|---|---|")
print("\n".join(sweep_rows))
