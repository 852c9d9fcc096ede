#!/usr/bin/env python3
"""A Hugging Face Llama model trained by pipetrain on 2 stages against transformers' own eager loop.

The same model (a LlamaConfig of about 20M parameters with random weights, written once by
save_pretrained and read by both: pipetrain's hf family, transformers' from_pretrained), the same
batch (the token file holds exactly one batch of windows, so every step of both sees the same
samples, in whatever order), AdamW with the same settings, the same batch size and sequence
length. transformers runs the plain loop (forward without a cache, the cross-entropy of the
logits against the same targets as pipetrain's, backward, step) with
torch.set_num_threads(2) -- both cores of this machine; pipetrain runs 2 stage threads of one
intra-op thread each (4 micro-batches, 1F1B, no recomputation, stages balanced by profiled
time). Each run is a fresh process; runs alternate (pipetrain, transformers,
pipetrain, ...) for --rounds rounds, so both see the same machine. A run's figure is the batch
over its median step time after --warmup steps; every run's first loss must equal the other
system's (1e-4 relative), or the run is reported as an error, not timed.

    bash bench/hf_throughput.sh                  # the defaults, into bench/results/hf_throughput.jsonl
    bash bench/hf_throughput.sh build --lora 16 --json bench/results/hf_throughput_lora.jsonl   # both LoRA
    python bench/hf_throughput.py build/apps/pipetrain --rounds 1 --steps 2 --warmup 1   # a quick check

Run with the project's venv (torch, transformers). Writes one JSON object per run and a summary
line last, and prints a table of medians and ranges.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_pipelining import cpu_model, run_ours  # noqa: E402

PIPETRAIN = "pipetrain, 2 stages x 1 thread"
TRANSFORMERS = "transformers, 2 threads"


def make_model(work, a):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                         max_position_embeddings=max(512, a.seq_len))
    model = LlamaForCausalLM(config)
    model.save_pretrained(os.path.join(work, "model"))
    return sum(p.numel() for p in model.parameters())


def make_data(work, a):
    """One batch of windows (seq_len + 1 ids, one every seq_len) for training, one window for the test."""
    rng = np.random.default_rng(0)
    for name, windows in (("train.bin", a.batch), ("test.bin", 1)):
        rng.integers(0, a.vocab, windows * a.seq_len + 1, dtype=np.uint16).tofile(os.path.join(work, name))


def pipetrain_config(work, a):
    c = {"model": {"family": "hf", "path": os.path.join(work, "model"), "seq_len": a.seq_len},
         "data": {"kind": "tokens", "path": os.path.join(work, "train.bin"), "test_path": os.path.join(work, "test.bin"),
                  "batch_size": a.batch},
         "pipeline": {"stages": 2, "micro_batches": a.micro_batches, "schedule": a.schedule, "recompute": a.recompute,
                      "balance": "time"},
         "optimizer": {"kind": "adamw", "lr": a.lr, "weight_decay": 0.0},
         "train": {"steps": a.warmup + a.steps, "log_every": a.warmup + a.steps, "eval_batches": 1},
         "runtime": {"intra_op_threads": 1}}
    if a.lora:
        c["model"]["lora"] = {"rank": a.lora, "alpha": 2 * a.lora, "targets": "all"}
    path = os.path.join(work, "pipetrain.json")
    with open(path, "w") as f:
        json.dump(c, f)
    return path


def transformers_steps(work, a):
    """The plain eager loop, in this (fresh) process: prints {"times": [...], "losses": [...]}."""
    from transformers import LlamaForCausalLM

    torch.set_num_threads(a.threads)
    model = LlamaForCausalLM.from_pretrained(os.path.join(work, "model")).train()
    if a.lora:
        import peft
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = peft.get_peft_model(model, peft.LoraConfig(r=a.lora, lora_alpha=2 * a.lora, target_modules=targets)).train()
    ids = torch.from_numpy(np.fromfile(os.path.join(work, "train.bin"), dtype=np.uint16).astype(np.int64))
    windows = torch.stack([ids[r * a.seq_len:r * a.seq_len + a.seq_len + 1] for r in range(a.batch)])
    x, y = windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    times, losses = [], []
    for _ in range(a.warmup + a.steps):
        t = time.perf_counter()
        logits = model(input_ids=x, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        times.append(time.perf_counter() - t)
    print(json.dumps({"times": times, "losses": losses, "attention": model.config._attn_implementation,
                      "trained_parameters": sum(p.numel() for p in trained)}))


def run_transformers(work, a):
    cmd = [sys.executable, os.path.abspath(__file__), "--transformers-loop", work] + a.passed
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return {"step_s": statistics.median(out["times"][a.warmup:]), "first_loss": out["losses"][0],
            "attention": out["attention"]}


def summarize(table):
    rows = {}
    for who, figures in table.items():
        if figures:
            rows[who] = {"median": statistics.median(figures), "min": min(figures), "max": max(figures), "runs": len(figures)}
    if PIPETRAIN in rows and TRANSFORMERS in rows:
        rows["ratio"] = rows[PIPETRAIN]["median"] / rows[TRANSFORMERS]["median"]
    return rows


def lscpu():
    """lscpu's description of the processor (model, family, caches), where lscpu is installed."""
    keys = ("Model name", "CPU family", "Model", "Stepping", "L2 cache", "L3 cache", "Hypervisor vendor")
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return {}
    pairs = (line.split(":", 1) for line in out.splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in pairs if k.strip() in keys}


def arguments():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pipetrain", nargs="?", help="the pipetrain binary")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--recompute", default="never")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=1152)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2, help="transformers' torch threads")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a run may take")
    ap.add_argument("--json", help="write one JSON object per run and a summary to this file")
    ap.add_argument("--lora", type=int, default=0, metavar="RANK",
                    help="both sides train LoRA adapters of this rank on every projection, all else frozen "
                         "(pipetrain's model.lora; transformers through PEFT), alpha 2 x rank")
    ap.add_argument("--transformers-loop", metavar="WORK", help=argparse.SUPPRESS)
    a = ap.parse_args()
    # What the child process of a transformers run is given again (its loop's settings).
    a.passed = [f"--{k}={v}" for k, v in (("steps", a.steps), ("warmup", a.warmup), ("batch", a.batch),
                                          ("seq-len", a.seq_len), ("lr", a.lr), ("threads", a.threads), ("lora", a.lora))]
    return a


def main():
    a = arguments()
    if a.transformers_loop:
        return transformers_steps(a.transformers_loop, a)
    if not a.pipetrain:
        sys.exit("usage: hf_throughput.py PIPETRAIN [options]")
    work = tempfile.mkdtemp(prefix="hf_throughput_")
    parameters = make_model(work, a)
    make_data(work, a)
    config = pipetrain_config(work, a)
    import transformers
    machine = {"cpu": cpu_model(), "lscpu": lscpu(), "cores": os.cpu_count(), "torch": torch.__version__,
               "transformers": transformers.__version__, "python": platform.python_version(),
               "pipetrain": subprocess.run([a.pipetrain, "--version"], capture_output=True, text=True).stdout.split("\n")[0]}
    setup = {"parameters": parameters, "vocab": a.vocab, "hidden": a.hidden, "layers": a.layers, "heads": a.heads,
             "kv_heads": a.kv_heads, "intermediate": a.intermediate, "seq_len": a.seq_len, "batch": a.batch,
             "micro_batches": a.micro_batches, "schedule": a.schedule, "recompute": a.recompute, "steps": a.steps,
             "warmup": a.warmup, "lora_rank": a.lora}
    print(f"hf_throughput: Llama of {parameters / 1e6:.1f}M parameters, batch {a.batch} x {a.seq_len} tokens, "
          f"{a.rounds} rounds of {a.warmup} + {a.steps} steps; {machine['cpu']}, {machine['cores']} cores")
    out = open(a.json, "w") if a.json else None
    table = {PIPETRAIN: [], TRANSFORMERS: []}
    start = time.time()
    for rnd in range(a.rounds):
        t = time.time()
        ours = dict(run_ours(a.pipetrain, config, False, work, a.timeout, a.warmup), wall_s=round(time.time() - t, 1))
        t = time.time()
        theirs = dict(run_transformers(work, a), wall_s=round(time.time() - t, 1))
        for who, r, other in ((PIPETRAIN, ours, theirs), (TRANSFORMERS, theirs, ours)):
            line = {"who": who, "round": rnd, **setup, "machine": machine, **r}
            if "error" not in r and "error" not in other and abs(r["first_loss"] - other["first_loss"]) > 1e-4 * abs(other["first_loss"]):
                line["error"] = f"first loss {r['first_loss']:.6f}, the other's {other['first_loss']:.6f}"
            if "error" not in line:
                line["samples_per_s"] = a.batch / r["step_s"]
                table[who].append(line["samples_per_s"])
            print(json.dumps(line), file=out) if out else None
            print(f"round {rnd} {who:32s} " + (f"{line['samples_per_s']:7.2f} samples/s, step {r['step_s']:.3f} s, "
                                                f"first loss {r['first_loss']:.6f}" if "samples_per_s" in line
                                                else f"error: {line['error']}"), flush=True)
    summary = summarize(table)
    if out:
        print(json.dumps({"summary": summary, **setup, "machine": machine, "rounds": a.rounds,
                          "wall_s": round(time.time() - start, 1)}), file=out)
        out.close()
    print(f"\n| system | samples/s, median | range | runs |\n|---|---|---|---|")
    for who in (PIPETRAIN, TRANSFORMERS):
        s = summary.get(who)
        print(f"| {who} | {s['median']:.2f} | {s['min']:.2f}-{s['max']:.2f} | {s['runs']} |" if s else f"| {who} | failed | | |")
    if "ratio" in summary:
        print(f"\npipetrain / transformers: {summary['ratio']:.2f}x (medians); {time.time() - start:.0f} s")
    if any(not f for f in table.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
