#!/usr/bin/env python3
"""Hostile inputs against the real binary, as processes: configs, rendezvous stores and peers.

  python3 fuzz/hostile.py BUILD [--configs 300] [--stores 100] [--peers 100] [--seed 7]

- configs: mutations of the shipped configs (values of the wrong type, out of range, huge,
  negative, NaN-like text, deep nesting, unknown keys, bytes that are not UTF-8, truncated
  text), each run as `pipetrain train CONFIG --steps 1` under a deadline;
- stores: a two-rank job (`pipetrain launch`, runtime.kind processes) while a client of its
  rendezvous store sends random bytes, garbage length prefixes, or one byte and holds on;
- peers: `hostile_peer_test --gtest_filter=*RandomHeadersAreRefused` with PIPETRAIN_HOSTILE_HEADERS
  set: a peer that passes the rendezvous and then sends random message headers.

A crash is an exit by a signal (SIGSEGV, SIGABRT, ...); a hang is a run past its deadline.
Prints one line per category and exits non-zero if any crashed or hung.
"""
import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HOSTILE_VALUES = [None, True, -1, 0, -2**63, 2**63, 2**64 + 1, 1e308, -1e308, 1.5, "abc", "", "1e400", "-0",
                  [], {}, [1] * 1000, {"a": 1}, "\u0000", "\U0001F600" * 100, 4294967297, 1e-320]


def mutate(cfg, rng):
    """One hostile change to a parsed config, or a text-level change (returns text)."""
    kind = rng.randrange(8)
    paths = []

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                paths.append(path + [k])
                walk(v, path + [k])
    walk(cfg, [])
    if kind <= 3 and paths:  # a value replaced by a hostile one
        path = rng.choice(paths)
        node = cfg
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = rng.choice(HOSTILE_VALUES)
        return json.dumps(cfg)
    if kind == 4:  # an unknown key at a random level
        node = cfg
        for k in rng.choice(paths)[:-1] if paths else []:
            node = node[k]
        node["x" * rng.randint(1, 3000)] = 1
        return json.dumps(cfg)
    if kind == 5:  # deep nesting somewhere
        depth = rng.choice([65, 1000, 100000])
        text = json.dumps(cfg)
        return text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}"
    if kind == 6:  # bytes that are not UTF-8 in a string, or raw garbage
        text = json.dumps(cfg).encode()
        at = rng.randrange(len(text))
        return text[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16))) + text[at:]
    text = json.dumps(cfg)  # truncated
    return text[: rng.randrange(len(text))]


def run(cmd, deadline, **kw):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=deadline, **kw)
        return p.returncode, p.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        return "hang", (e.stdout or b"").decode(errors="replace")


def configs(binary, n, rng, work):
    shipped = [json.load(open(os.path.join(HERE, "configs", f))) for f in sorted(os.listdir(os.path.join(HERE, "configs")))]
    counts = {"ok": 0, "error": 0, "crash": 0, "hang": 0}
    bad = []
    for i in range(n):
        cfg = json.loads(json.dumps(rng.choice(shipped)))
        cfg.setdefault("data", {})
        text = mutate(cfg, rng)
        path = os.path.join(work, f"config{i}.json")
        with open(path, "wb") as f:
            f.write(text if isinstance(text, bytes) else text.encode())
        status, out = run([binary, "train", path, "--steps", "1", "--quiet", "--set", "train.eval_batches=1"], 120)
        if status == "hang":
            counts["hang"] += 1
            bad.append((path, "hang"))
        elif status < 0:
            counts["crash"] += 1
            bad.append((path, f"signal {-status}: {out[-300:]}"))
        elif status == 0:
            counts["ok"] += 1
        else:
            counts["error"] += 1
            lines = out.strip().splitlines()
            if len(lines) != 1 or not lines[0].startswith("pipetrain: error: ") or len(lines[0]) > 1000:
                bad.append((path, "not one short error line: " + out[:300]))
    return counts, bad


def attacker(port, rng, stop):
    """Connects to the store again and again, sending random bytes or garbage length prefixes."""
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                choice = rng.randrange(3)
                if choice == 0:
                    s.sendall(bytes(rng.randrange(256) for _ in range(rng.randint(1, 4096))))
                elif choice == 1:
                    s.sendall(bytes([rng.randrange(16)]) + (2**28).to_bytes(8, "little"))
                else:
                    s.sendall(b"\x01")
                stop.wait(rng.uniform(0, 0.3))  # holds the connection a while
        except OSError:
            stop.wait(0.01)


def stores(binary, n, rng, work):
    counts = {"completed": 0, "error": 0, "crash": 0, "hang": 0}
    bad = []
    cfg = os.path.join(work, "store.json")
    with open(cfg, "w") as f:
        json.dump({"model": {"family": "mlp", "in": 8, "width": 8, "layers": 3, "out": 4},
                   "data": {"kind": "synthetic", "batch_size": 8, "samples": 64, "test_samples": 16},
                   "pipeline": {"stages": 2, "micro_batches": 2}, "train": {"steps": 2}}, f)
    for i in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        stop = threading.Event()
        t = threading.Thread(target=attacker, args=(port, random.Random(rng.random()), stop))
        t.start()
        status, out = run([binary, "launch", "--nproc", "2", "--master-port", str(port), "--", "train", cfg,
                           "--quiet", "--set", "runtime.kind=processes", "--set", "runtime.timeout_s=10"], 90)
        stop.set()
        t.join()
        if status == "hang":
            counts["hang"] += 1
            bad.append((i, "hang"))
        elif status == 0:
            counts["completed"] += 1
        elif status > 128 or status < 0:
            counts["crash"] += 1
            bad.append((i, out[-400:]))
        else:
            counts["error"] += 1
    return counts, bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--configs", type=int, default=300)
    ap.add_argument("--stores", type=int, default=100)
    ap.add_argument("--peers", type=int, default=100)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    binary = os.path.join(a.build, "apps", "pipetrain")
    work = tempfile.mkdtemp(prefix="pipetrain_hostile_")
    failed = False

    def part(run_part, line):
        """Runs one part, prints its summary line (from its counts and seconds) and what went wrong."""
        t0 = time.time()
        counts, bad = run_part()
        print(line(counts, time.time() - t0))
        for b in bad:
            print("  ", b)
        return bool(bad)

    failed |= part(lambda: configs(binary, a.configs, rng, work),
                   lambda c, sec: f"configs: {a.configs} runs: {c['ok']} trained, {c['error']} refused with one line, "
                                  f"{c['crash']} crashed, {c['hang']} hung ({sec:.0f} s)")
    failed |= part(lambda: stores(binary, a.stores, rng, work),
                   lambda s, sec: f"stores: {a.stores} jobs under a hostile store client: {s['completed']} completed, "
                                  f"{s['error']} failed cleanly, {s['crash']} crashed, {s['hang']} hung ({sec:.0f} s)")
    t0 = time.time()
    env = dict(os.environ, PIPETRAIN_HOSTILE_HEADERS=str(a.peers))
    status, out = run([os.path.join(a.build, "tests", "hostile_peer_test"), "--gtest_filter=*RandomHeadersAreRefused"],
                      60 + 30 * a.peers, env=env)
    summary = [l for l in out.splitlines() if "random headers:" in l]
    print(f"peers: {summary[0] if summary else 'no summary'}; test {'passed' if status == 0 else 'FAILED'} "
          f"({time.time() - t0:.0f} s)")
    failed |= status != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
