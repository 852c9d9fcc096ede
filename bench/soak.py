#!/usr/bin/env python3
"""Soak: a multi-process run of several hundred steps whose ranks are killed (SIGKILL, a
different rank each time, at a random moment) and resumed from the latest checkpoint each time,
until it completes; then its per-step losses are compared with one uninterrupted in-process run
of the same config. Every wait is bounded.

  python3 bench/soak.py BUILD [--steps 400] [--kills 4] [--seed 1] > bench/results/soak.txt

Config: configs/gpt_small.json on 3 stages (1f1b, dropout 0.1, AdamW), a checkpoint every 20
steps. Passes when every attempt but the last ends with a non-zero status within the timeout of
the kill, the last completes, and every step's loss equals the uninterrupted run's bit for bit.
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def losses(path):
    out = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by the kill
            if "loss" in row and "step" in row:
                out[row["step"]] = row["loss"]
    return out


def children(pid):
    kids = []
    task = f"/proc/{pid}/task"
    for t in os.listdir(task) if os.path.isdir(task) else []:
        try:
            kids += [int(x) for x in open(f"{task}/{t}/children").read().split()]
        except OSError:
            pass
    return kids


def rank_of(pid):
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return -1
    for e in env:
        if e.startswith(b"RANK="):
            return int(e[5:])
    return -1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--kills", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=5.0, help="runtime.timeout_s")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    binary = os.path.join(a.build, "apps", "pipetrain")
    work = tempfile.mkdtemp(prefix="pipetrain_soak_")
    config = os.path.join(HERE, "configs", "gpt_small.json")
    common = ["train", config, "--quiet", "--steps", str(a.steps), "--set", "pipeline.stages=3", "--set",
              "pipeline.schedule=1f1b", "--set", "train.eval_batches=2"]
    t0 = time.time()
    ref = os.path.join(work, "reference.jsonl")
    subprocess.run([binary] + common + ["--metrics", ref], check=True, timeout=1800,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    reference = losses(ref)
    print(f"# {time.strftime('%Y-%m-%d')} soak: {a.steps} steps of gpt_small on 3 processes (1f1b, checkpoint every "
          f"20 steps, runtime.timeout_s {a.timeout}), {a.kills} SIGKILLs at random moments, seed {a.seed}")
    print(f"uninterrupted in-process reference: {len(reference)} steps in {time.time() - t0:.1f} s")

    metrics = os.path.join(work, "soak.jsonl")
    ckpt = os.path.join(work, "checkpoints")
    failures = []
    attempt = 0
    while True:
        attempt += 1
        resume = ["--resume"] if attempt > 1 else []
        cmd = [binary, "launch", "--nproc", "3", "--"] + common + [
            "--metrics", metrics, "--checkpoint-dir", ckpt, "--set", "train.checkpoint_every=20",
            "--set", "runtime.kind=processes",
            "--set", f"runtime.timeout_s={a.timeout}"] + resume
        log = open(os.path.join(work, f"attempt{attempt}.log"), "w")
        launcher = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        before = max(losses(metrics), default=0)
        saved = sorted(d for d in os.listdir(ckpt) if d.startswith("step-")) if os.path.isdir(ckpt) else []
        start = f"checkpoint {saved[-1]}" if resume and saved else "the start"
        victim_rank = (attempt - 1) % 3
        killed_at = None
        if attempt <= a.kills:
            # Kill once training has gone on for a random number of steps past the resume point.
            target = before + rng.randint(5, max(6, (a.steps - before) // max(1, a.kills - attempt + 2)))
            deadline = time.time() + 600
            while launcher.poll() is None and time.time() < deadline and max(losses(metrics), default=0) < target:
                time.sleep(0.05)
            # A random moment inside a step, not only at its boundary.
            time.sleep(rng.uniform(0, 0.05))
            pids = [p for p in children(launcher.pid) if rank_of(p) == victim_rank]
            if pids and launcher.poll() is None:
                os.kill(pids[0], signal.SIGKILL)
                killed_at = time.time()
        try:
            status = launcher.wait(timeout=900)
        except subprocess.TimeoutExpired:
            launcher.kill()
            status = "hung"
        ended = time.time()
        log.close()
        done = max(losses(metrics), default=0)
        if killed_at is not None:
            text = open(os.path.join(work, f"attempt{attempt}.log")).read()
            named = f"rank {victim_rank}" in text
            print(f"attempt {attempt}: from {start}, rank {victim_rank} killed near step {done}; "
                  f"launcher exit {status} {ended - killed_at:.2f} s after the kill; the victim named: {named}")
            if status == 0 or status == "hung" or ended - killed_at > a.timeout + 15:
                failures.append(f"attempt {attempt} did not fail promptly (status {status})")
            continue
        print(f"attempt {attempt}: from {start}, ran to step {done}, exit {status}")
        if status != 0:
            failures.append(f"the last attempt exited with {status}")
        break

    soak = losses(metrics)
    missing = [s for s in reference if s not in soak]
    # Every line, also those of steps run again after a resume, against the reference.
    lines = differ = 0
    with open(metrics) as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "loss" in row and "step" in row:
                lines += 1
                if reference.get(row["step"]) != row["loss"]:
                    differ += 1
    print(f"steps logged: {len(soak)} of {len(reference)} ({lines} lines, steps after a checkpoint logged again "
          f"by the resumed run); missing {len(missing)}; lines whose loss differs from the reference: {differ}")
    if missing:
        failures.append(f"steps missing from the soak's metrics: {missing[:10]}")
    if differ:
        failures.append(f"{differ} losses differ from the reference")
    print(f"total {time.time() - t0:.1f} s; result: {'PASS' if not failures else 'FAIL: ' + '; '.join(failures)}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
