#!/usr/bin/env python3
"""pipetrain against PyTorch's own torch.distributed.pipelining, side by side on one machine.

The same network (CONFIG's model, rebuilt in Python by bench/twins.py, its initial weights
written by `pipetrain export --initial`; dropout 0 on both sides, as only pipetrain's masks are
the same under any split), the same batch (written here as .npy files, read by pipetrain's data.kind "tensors";
the data set is exactly one batch, so the first step sees the same samples on both sides, in
whatever order) and the same split into stages; every schedule both have, at each micro-batch
size, in alternating rounds: the peer as 2 processes over Gloo (one intra-op thread each), ours as
2 stage threads and as 2 processes (`pipetrain launch`). The first step's loss of each run is
checked against the peer's; a run whose loss differs is reported as such, not timed. With
`--set KEY=VALUE`, ours also runs (threads and processes, in the same rounds) with those overrides.

    python bench/peer_pipelining.py build/apps/pipetrain --rows 8,64 --rounds 3 --json bench/results/peer.jsonl
    python bench/peer_pipelining.py build/apps/pipetrain --config configs/gpt_small.json --rows 8,32
    python bench/peer_pipelining.py build/apps/pipetrain --rows 64 --set pipeline.defer_weight_grads=true

Run with the project's venv (torch 2.11). Prints a table of median samples/s and writes one JSON
object per run.
"""
import argparse
import collections
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import twins  # noqa: E402

# ours -> (the peer's class, chunks per rank, V placement)
SCHEDULES = collections.OrderedDict([
    ("gpipe", ("ScheduleGPipe", 1, False)),
    ("1f1b", ("Schedule1F1B", 1, False)),
    ("zb-h1", ("ScheduleInterleavedZeroBubble", 1, False)),
    ("interleaved-1f1b", ("ScheduleInterleaved1F1B", 2, False)),
    ("looped-bfs", ("ScheduleLoopedBFS", 2, False)),
    ("zb-v", ("ScheduleZBVZeroBubble", 2, True)),
    ("dualpipev", ("ScheduleDualPipeV", 2, True)),
])
STAGES = 2


def balance(layers, parts):
    """Contiguous and as even as possible, the longer parts last (written into both configs)."""
    base, extra = divmod(layers, parts)
    return [base + (1 if i >= parts - extra else 0) for i in range(parts)]


def stage_ids(rank, chunks, v_shape):
    if chunks == 1:
        return [rank]
    return [rank, 2 * STAGES - 1 - rank] if v_shape else [rank + STAGES * c for c in range(chunks)]


def peer_rank(rank, spec, out_path):
    """One rank of the peer: its stages, its schedule, `steps` training steps."""
    result = {"rank": rank}
    try:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(spec["port"])
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=STAGES, timeout=datetime.timedelta(seconds=60))
        from torch.distributed import pipelining
        model = twins.build(spec["model"])
        model.load_state_dict(torch.load(spec["init"]))
        layers = list(model.children())
        cls_name, chunks, v_shape = SCHEDULES[spec["schedule"]]
        V = STAGES * chunks
        bounds = np.cumsum([0] + spec["balance"]).tolist()
        ids = stage_ids(rank, chunks, v_shape)
        stages = [pipelining.PipelineStage(torch.nn.Sequential(*layers[bounds[i]:bounds[i + 1]]), i, V, torch.device("cpu"))
                  for i in ids]
        cls = getattr(pipelining, cls_name)
        multi = chunks > 1 or cls_name == "ScheduleInterleavedZeroBubble"
        sched = cls(stages if multi else stages[0], n_microbatches=spec["micro_batches"],
                    loss_fn=twins.loss)
        params = [p for s in stages for p in s.submod.parameters()]
        o = spec["optimizer"]
        if o.get("kind", "sgd") == "sgd":
            opt = torch.optim.SGD(params, lr=o["lr"], momentum=o.get("momentum", 0.0), weight_decay=o.get("weight_decay", 0.0))
        elif o["kind"] in ("adam", "adamw"):
            cls_opt = torch.optim.AdamW if o["kind"] == "adamw" else torch.optim.Adam
            opt = cls_opt(params, lr=o["lr"], betas=tuple(o.get("betas", (0.9, 0.999))), eps=o.get("eps", 1e-8),
                          weight_decay=o.get("weight_decay", 0.0))
        else:
            raise ValueError(f"optimizer {o['kind']} has no twin here")
        x = torch.from_numpy(np.load(os.path.join(spec["data"], "inputs.npy")))
        y = torch.from_numpy(np.load(os.path.join(spec["data"], "targets.npy")))
        first, last = 0 in ids, V - 1 in ids
        times, first_loss = [], None
        for step in range(spec["steps"]):
            t = time.perf_counter()
            opt.zero_grad()
            losses = []
            if first and last:
                sched.step(x, target=y, losses=losses)
            elif first:
                sched.step(x)
            elif last:
                sched.step(target=y, losses=losses)
            else:
                sched.step()
            opt.step()
            times.append(time.perf_counter() - t)
            if step == 0 and losses:
                first_loss = float(torch.stack([l.detach() for l in losses]).mean())
        result.update(times=times, first_loss=first_loss)
        dist.destroy_process_group()
    except Exception as e:  # reported as the peer's failure, one line
        result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    with open(out_path, "w") as f:
        json.dump(result, f)


def cpu_model():
    """The CPU's model name (platform.processor() is empty on Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_peer(spec, work, timeout_s):
    ctx = mp.get_context("spawn")
    spec = dict(spec, port=free_port())
    outs = [os.path.join(work, f"peer_{r}.json") for r in range(STAGES)]
    for o in outs:
        if os.path.exists(o):
            os.remove(o)
    procs = [ctx.Process(target=peer_rank, args=(r, spec, outs[r])) for r in range(STAGES)]
    for p in procs:
        p.start()
    deadline = time.time() + timeout_s
    for p in procs:
        p.join(max(1, deadline - time.time()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    results = [json.load(open(o)) if os.path.exists(o) else {"error": "no result (killed after the time limit)"} for o in outs]
    errors = [f"rank {r['rank']}: {r['error']}" for r in results if "error" in r]
    if errors:
        return {"error": "; ".join(errors)}
    loss = next(r["first_loss"] for r in results if r.get("first_loss") is not None)
    return {"step_s": statistics.median(results[0]["times"][spec["warmup"]:]), "first_loss": loss}


def run_ours(binary, config_path, processes, work, timeout_s, warmup, sets=()):
    metrics = os.path.join(work, "ours.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [binary, "train", config_path, "--quiet", "--metrics", metrics] + [x for kv in sets for x in ("--set", kv)]
    if processes:
        cmd = [binary, "launch", "--nproc", str(STAGES), "--"] + cmd[1:] + ["--set", "runtime.kind=processes"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]}
    steps = [json.loads(l) for l in open(metrics) if l.strip()]
    steps = [s for s in steps if "event" not in s and "step_time_s" in s]
    return {"step_s": statistics.median(s["step_time_s"] for s in steps[warmup:]), "first_loss": steps[0]["loss"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pipetrain", help="the pipetrain binary")
    ap.add_argument("--config", default="configs/mlp_bench.json")
    ap.add_argument("--rows", default="8,64", help="micro-batch rows to compare (comma-separated)")
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=300, help="seconds a run may take")
    ap.add_argument("--json", help="append one JSON object per run to this file")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="also run ours (threads and processes) with this config override, in the same rounds "
                         "(repeatable: all of them together), e.g. pipeline.defer_weight_grads=true")
    a = ap.parse_args()
    cfg = json.load(open(a.config))
    m = cfg["model"] = twins.without_dropout(cfg["model"])
    try:
        n_layers = len(twins.build(m))
    except ValueError as e:
        sys.exit(f"{a.config}: {e}")
    work = tempfile.mkdtemp(prefix="peer_")
    init = os.path.join(work, "init.pt")
    base = os.path.join(work, "base.json")
    json.dump(cfg, open(base, "w"))
    subprocess.run([a.pipetrain, "export", "--initial", base, init], check=True, capture_output=True)
    versions = {"torch": torch.__version__, "python": platform.python_version(), "cpu": cpu_model(),
                "cores": os.cpu_count(), "pipetrain": subprocess.run([a.pipetrain, "--version"], capture_output=True,
                                                                    text=True).stdout.strip()}
    out = open(a.json, "a") if a.json else None
    table = collections.defaultdict(list)  # (rows, schedule, who) -> samples/s per round
    notes = {}
    for rows in [int(r) for r in a.rows.split(",")]:
        B = rows * a.micro_batches
        data = os.path.join(work, f"data_{rows}")
        os.makedirs(data, exist_ok=True)
        for prefix, n, seed in (("", B, 0), ("test_", 8, 1)):
            x, y = twins.sample_batch(m, n, seed)
            np.save(os.path.join(data, prefix + "inputs.npy"), x)
            np.save(os.path.join(data, prefix + "targets.npy"), y)
        for name in a.schedules.split(","):
            _, chunks, _ = SCHEDULES[name]
            bal = balance(n_layers, STAGES * chunks)
            c = json.loads(json.dumps(cfg))
            c["data"] = {"kind": "tensors", "path": data, "batch_size": B}
            c["pipeline"].update(stages=STAGES, micro_batches=a.micro_batches, schedule=name, chunks=chunks, balance=bal,
                                 recompute="never")
            c["train"].update(steps=a.steps, log_every=max(1, a.steps))
            c.setdefault("runtime", {})["intra_op_threads"] = 1
            path = os.path.join(work, f"{name}_{rows}.json")
            json.dump(c, open(path, "w"))
            spec = {"model": m, "init": init, "schedule": name, "balance": bal, "micro_batches": a.micro_batches,
                    "optimizer": c["optimizer"], "data": data,
                    "steps": a.steps, "warmup": a.warmup}
            for rnd in range(a.rounds):
                peer = run_peer(spec, work, a.timeout)
                runs = {"peer (2 processes, gloo)": peer,
                        "ours, threads": run_ours(a.pipetrain, path, False, work, a.timeout, a.warmup),
                        "ours, 2 processes": run_ours(a.pipetrain, path, True, work, a.timeout, a.warmup)}
                if a.set:
                    runs[f"ours+, threads"] = run_ours(a.pipetrain, path, False, work, a.timeout, a.warmup, a.set)
                    runs[f"ours+, 2 processes"] = run_ours(a.pipetrain, path, True, work, a.timeout, a.warmup, a.set)
                for who, r in runs.items():
                    line = {"config": a.config, "rows": rows, "batch": B, "schedule": name, "who": who, "round": rnd, "machine": versions, **r}
                    if who.startswith("ours+"):
                        line["overrides"] = a.set
                    if "error" not in r and "error" not in peer and abs(r["first_loss"] - peer["first_loss"]) > 1e-4 * abs(peer["first_loss"]):
                        line["error"] = f"first loss {r['first_loss']:.6f}, the peer's {peer['first_loss']:.6f}"
                    if "error" in line:
                        notes[(rows, name, who)] = line["error"]
                    else:
                        line["samples_per_s"] = B / r["step_s"]
                        table[(rows, name, who)].append(line["samples_per_s"])
                    print(json.dumps(line), file=out) if out else None
                    print(f"rows {rows} {name:17s} round {rnd} {who:26s} " +
                          (f"{line['samples_per_s']:8.0f} samples/s, first loss {r['first_loss']:.6f}" if "samples_per_s" in line
                           else "failed: " + line["error"]), flush=True)
    whos = ["peer (2 processes, gloo)", "ours, threads", "ours, 2 processes"]
    if a.set:
        print("\nours+: with " + " ".join("--set " + kv for kv in a.set))
        whos += ["ours+, threads", "ours+, 2 processes"]
    print("\n| rows | schedule | " + " | ".join(whos) + " | " + " | ".join(w + " / peer" for w in whos[1:]) + " |")
    print("|---|---|" + "---|" * (2 * len(whos) - 1))
    for rows in [int(r) for r in a.rows.split(",")]:
        for name in a.schedules.split(","):
            med = {w: statistics.median(table[(rows, name, w)]) if table[(rows, name, w)] else None for w in whos}
            cell = lambda w: (f"{med[w]:.0f} ({min(table[(rows, name, w)]):.0f}-{max(table[(rows, name, w)]):.0f})"
                              if med[w] else "fails: " + notes.get((rows, name, w), "?"))
            ratio = lambda w: f"{med[w] / med[whos[0]]:.2f}x" if med[w] and med[whos[0]] else "-"
            print(f"| {rows} | {name} | " + " | ".join(cell(w) for w in whos) + " | " + " | ".join(ratio(w) for w in whos[1:]) + " |")


if __name__ == "__main__":
    main()
