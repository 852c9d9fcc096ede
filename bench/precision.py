#!/usr/bin/env python3
"""bf16 against fp32 on this machine: speed side by side, convergence, and why.

  python3 bench/precision.py [BUILD] [--repeat R] [--rounds N] [--skip-convergence] > bench/results/precision.md

Speed: `pipetrain bench CONFIG --precision fp32,bf16` for the MLP, GPT and CNN configs: in each
run the plain single-device loop and the pipeline are timed in fp32, then in bf16, back to back
(median of R timed steps each, with the fastest and slowest step); N rounds, and the table gives
the median of the rounds' medians with the range over rounds. Ratio = fp32 step / bf16 step
(above 1: bf16 is faster).

Why: one matrix product of each size through libtorch on one thread, fp32 and bf16 (this
machine's venv torch, the libtorch the build links).

Convergence: the default Fashion-MNIST run and the byte-level GPT (its test loss every 50 steps)
in fp32 and in bf16; the GPT's two test-loss curves in one plot (gnuplot) beside this file.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(HERE, "bench", "results")


def run(cmd, **kw):
    p = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True, timeout=3600, **kw)
    if p.returncode != 0:
        sys.exit(f"precision.py: {' '.join(cmd)} failed:\n{p.stdout}{p.stderr}")
    return p.stdout


def speed(binary, repeat, rounds):
    workloads = [
        ("MLP (configs/mlp_bench.json)", ["configs/mlp_bench.json"]),
        ("GPT (configs/gpt_small.json)", ["configs/gpt_small.json"]),
        ("CNN (configs/fashion_mnist_cnn.json, synthetic images)",
         ["configs/fashion_mnist_cnn.json", "--set", "data.kind=synthetic"]),
    ]
    rows = []
    for name, args in workloads:
        per = {}  # (precision, part) -> [median step ms per round]
        for _ in range(rounds):
            with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
                run([binary, "bench", *args, "--precision", "fp32,bf16", "--warmup", "2", "--repeat", str(repeat),
                     "--json", f.name])
                lines = [json.loads(l) for l in open(f.name)]
            for line in lines:
                if "skipped" in line:
                    sys.exit(f"precision.py: {name} {line['precision']}: {line['skipped']}")
                b = line["batch_size"]
                per.setdefault((line["precision"], "plain"), []).append(1e3 * b / line["baseline_samples_per_s"])
                per.setdefault((line["precision"], "pipeline"), []).append(1e3 * b / line["pipeline_samples_per_s"])
                stages, mbs = line["stages"], line["micro_batches"]
        for part in ("plain", "pipeline"):
            f32, b16 = per[("fp32", part)], per[("bf16", part)]
            label = "plain loop, 1 thread" if part == "plain" else f"pipeline, {stages} stages x {mbs} micro-batches"
            rows.append((name, label, f32, b16))
    return rows


def gemm():
    py = os.environ.get("PIPETRAIN_TORCH_PYTHON")
    if not py:
        py = subprocess.run(["bash", "-c", "source scripts/env.sh && pipetrain_python"], cwd=HERE,
                            capture_output=True, text=True).stdout.strip()
    code = r"""
import time, torch
torch.set_num_threads(1)
def t(f):
    for _ in range(3): f()
    v = []
    for _ in range(15):
        s = time.perf_counter(); f(); v.append(time.perf_counter() - s)
    return sorted(v)[7] * 1e3
for m in (64, 256, 1024):
    r = {}
    for dt in (torch.float32, torch.bfloat16):
        a = torch.randn(m, 1024, dtype=dt); b = torch.randn(1024, 1024, dtype=dt)
        r[dt] = t(lambda: a @ b)
    print(m, r[torch.float32], r[torch.bfloat16])
"""
    out = run([py, "-c", code])
    return [tuple(float(x) for x in l.split()) for l in out.splitlines() if l.strip()]


def final(metrics_path, key):
    last = None
    for l in open(metrics_path):
        j = json.loads(l)
        if j.get("event") == "test":
            last = j
    return last[key]


def convergence(binary, scratch):
    out = {}
    curves = {}
    for precision in ("fp32", "bf16"):
        m = os.path.join(scratch, f"precision_fashion_{precision}.jsonl")
        run([binary, "train", "configs/fashion_mnist_cnn.json", "--quiet", "--metrics", m,
             "--set", f"train.precision={precision}"])
        out[("fashion", precision)] = (final(m, "test_accuracy"), final(m, "test_loss"))
        g = os.path.join(scratch, f"precision_gpt_{precision}.jsonl")
        run([binary, "train", "configs/gpt_text.json", "--quiet", "--metrics", g,
             "--set", f"train.precision={precision}", "--set", "train.eval_every=50"])
        out[("gpt", precision)] = (final(g, "test_accuracy"), final(g, "test_loss"))
        curves[precision] = [(j["step"], j["test_loss"]) for j in map(json.loads, open(g))
                             if j.get("event") in ("eval", "test")]
    return out, curves


def plot(curves):
    data = {}
    for precision, points in curves.items():
        path = os.path.join(RESULTS, f"precision_gpt_{precision}.dat")
        with open(path, "w") as f:
            for s, l in points:
                f.write(f"{s} {l}\n")
        data[precision] = path
    png = os.path.join(RESULTS, "precision_gpt_test_loss.png")
    script = f"""set terminal pngcairo size 800,480 noenhanced
set output '{png}'
set title 'byte-level GPT (configs/gpt_text.json): test loss, fp32 and bf16'
set xlabel 'step'
set ylabel 'test loss (nats per byte)'
set grid
plot '{data['fp32']}' with linespoints title 'fp32', '{data['bf16']}' with linespoints title 'bf16'
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True)
    for p in data.values():
        os.remove(p)
    return png


def fmt(values):
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-convergence", action="store_true")
    a = ap.parse_args()
    binary = os.path.join(os.path.abspath(a.build), "apps", "pipetrain")
    print("# bf16 against fp32 on this machine\n")
    print(f"Reproduce: `python3 bench/precision.py build --repeat {a.repeat} --rounds {a.rounds}`.\n")
    print("## Step time, side by side\n")
    print(f"`pipetrain bench CONFIG --precision fp32,bf16 --repeat {a.repeat}`, {a.rounds} rounds: median step (ms) "
          "of the rounds' medians, range over rounds; ratio = fp32 / bf16 (above 1: bf16 faster).\n")
    print("| workload | run | fp32 step (ms) | bf16 step (ms) | fp32 / bf16 |")
    print("|---|---|---|---|---|")
    for name, label, f32, b16 in speed(binary, a.repeat, a.rounds):
        print(f"| {name} | {label} | {fmt(f32)} | {fmt(b16)} | {statistics.median(f32) / statistics.median(b16):.2f} |")
    print("\n## One matrix product through libtorch, one thread (M x 1024 by 1024 x 1024)\n")
    print("| M | fp32 (ms) | bf16 (ms) | fp32 / bf16 |")
    print("|---|---|---|---|")
    for m, f32, b16 in gemm():
        print(f"| {int(m)} | {f32:.2f} | {b16:.2f} | {f32 / b16:.2f} |")
    if a.skip_convergence:
        return
    with tempfile.TemporaryDirectory() as scratch:
        out, curves = convergence(binary, scratch)
    png = plot(curves)
    print("\n## Convergence\n")
    print("| run | fp32 | bf16 |")
    print("|---|---|---|")
    print(f"| Fashion-MNIST default run (configs/fashion_mnist_cnn.json): test accuracy | "
          f"{out[('fashion', 'fp32')][0]:.4f} | {out[('fashion', 'bf16')][0]:.4f} |")
    print(f"| byte-level GPT (configs/gpt_text.json): final test loss | "
          f"{out[('gpt', 'fp32')][1]:.4f} | {out[('gpt', 'bf16')][1]:.4f} |")
    print(f"\nThe GPT's test loss every 50 steps: [{os.path.basename(png)}]({os.path.basename(png)}).")


if __name__ == "__main__":
    main()
