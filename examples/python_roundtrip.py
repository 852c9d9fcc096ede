"""From Python to a pipelined pipetrain run, and back to Python.

    python examples/python_roundtrip.py PIPETRAIN WORKDIR

1. Python writes a network (a scripted torch.nn.Sequential) and its data (torch.save). Its
   initial weights are those of the same network written as a pipetrain layer list
   (`pipetrain export --initial`), so that the two can be compared step for step.
2. pipetrain trains it on 2 stages x 4 micro-batches (model.family torchscript, data.kind
   tensors), saving a checkpoint, and exports the trained weights; it trains the layer-list
   spelling the same way, and every step's loss of the two runs agrees.
3. Python loads the export into its own network (load_state_dict) and evaluates it on the test
   split: its test loss and accuracy equal those pipetrain reported for the same weights.

Prints one line per stage; exits non-zero when anything disagrees.
"""
import json
import os
import re
import subprocess
import sys

import torch


def main():
    pipetrain, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)

    # 1. The network and the data, in Python.
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    layers = [
        {"name": "c1", "type": "conv2d", "in_channels": 1, "out_channels": 8, "kernel_size": 3, "padding": 1},
        {"name": "r1", "type": "relu"},
        {"name": "p1", "type": "maxpool2d", "kernel_size": 2},
        {"name": "flat", "type": "flatten"},
        {"name": "fc", "type": "linear", "in_features": 128, "out_features": 32},
        {"name": "r2", "type": "relu"},
        {"name": "head", "type": "linear", "in_features": 32, "out_features": 4},
    ]
    common = {
        "data": {"kind": "tensors", "path": os.path.join(work, "data.pt"), "batch_size": 32},
        "pipeline": {"stages": 2, "micro_batches": 4, "schedule": "1f1b"},
        "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9},
        "train": {"steps": 40, "seed": 0},
    }
    listed = os.path.join(work, "layers.json")
    with open(listed, "w") as f:
        json.dump({"model": {"family": "layers", "input_shape": [1, 8, 8], "layers": layers}, **common}, f)
    init = os.path.join(work, "init.pt")
    run = subprocess.run([pipetrain, "export", "--initial", listed, init], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit("pipetrain export --initial failed:\n" + run.stdout + run.stderr)
    with torch.no_grad():  # the same tensors in the same order, under Python's names
        for p, v in zip(net.parameters(), torch.load(init, weights_only=True).values()):
            p.copy_(v)
    torch.jit.script(net).save(os.path.join(work, "net.pt"))
    g = torch.Generator().manual_seed(1)
    centers = torch.randn(4, 1, 8, 8, generator=g)
    def split(n):
        y = torch.randint(0, 4, (n,), generator=g)
        return centers[y] + 0.8 * torch.randn(n, 1, 8, 8, generator=g), y
    x, y = split(512)
    tx, ty = split(128)
    torch.save({"inputs": x, "targets": y, "test_inputs": tx, "test_targets": ty}, os.path.join(work, "data.pt"))
    print(f"python: wrote a {len(net)}-layer network and {len(x)} + {len(tx)} samples")

    # 2. Pipelined training, then the export.
    config = {"model": {"family": "torchscript", "path": os.path.join(work, "net.pt"), "input_shape": [1, 8, 8]},
              **common}
    cfg = os.path.join(work, "roundtrip.json")
    with open(cfg, "w") as f:
        json.dump(config, f)
    ckpt = os.path.join(work, "ckpt")
    for old in ("scripted.jsonl", "listed.jsonl"):
        if os.path.exists(os.path.join(work, old)):
            os.remove(os.path.join(work, old))
    if os.path.isdir(ckpt):
        import shutil
        shutil.rmtree(ckpt)
    run = subprocess.run([pipetrain, "train", cfg, "--quiet", "--checkpoint-dir", ckpt,
                          "--metrics", os.path.join(work, "scripted.jsonl")], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit("pipetrain train failed:\n" + run.stdout + run.stderr)
    m = re.search(r"test accuracy ([0-9.]+), test loss ([0-9.]+)", run.stdout + run.stderr)
    if not m:
        sys.exit("no test line from pipetrain:\n" + run.stdout + run.stderr)
    their_acc, their_loss = float(m.group(1)), float(m.group(2))
    print(f"pipetrain: trained on 2 stages; test accuracy {their_acc}, test loss {their_loss}")
    run = subprocess.run([pipetrain, "train", listed, "--quiet", "--metrics", os.path.join(work, "listed.jsonl")],
                         capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit("pipetrain train (layer list) failed:\n" + run.stdout + run.stderr)
    def losses(name):
        with open(os.path.join(work, name)) as f:
            return [json.loads(line)["loss"] for line in f if '"event"' not in line]
    a, b = losses("scripted.jsonl"), losses("listed.jsonl")
    worst = max(abs(x - y) / max(1e-12, abs(y)) for x, y in zip(a, b)) if a and len(a) == len(b) else float("inf")
    print(f"pipetrain: {len(a)} steps of the scripted network and of its layer list; largest relative loss difference {worst:.1e}")
    if worst > 1e-5:
        sys.exit("the scripted network and its layer list trained differently")
    exported = os.path.join(work, "trained.pt")
    run = subprocess.run([pipetrain, "export", ckpt, exported], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit("pipetrain export failed:\n" + run.stdout + run.stderr)

    # 3. Back in Python: the trained weights in the Python network.
    net.load_state_dict(torch.load(exported, weights_only=True))
    net.eval()
    with torch.no_grad():
        out = net(tx)
        loss = torch.nn.functional.cross_entropy(out, ty).item()
        acc = (out.argmax(1) == ty).float().mean().item()
    print(f"python: the exported weights give test accuracy {acc:.4f}, test loss {loss:.4f}")
    if abs(loss - their_loss) > 1e-3 * max(1.0, their_loss) or abs(acc - their_acc) > 1e-3:
        sys.exit("python and pipetrain disagree about the trained model")
    print("round trip: equal")


if __name__ == "__main__":
    main()
