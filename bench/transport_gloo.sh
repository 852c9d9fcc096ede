#!/usr/bin/env bash
# c10d's Gloo against UCX through pipetrain's Transport API (bench/transport_bench: two
# processes on this host, tensors with the wire header, every received tensor allocated and
# checked), run alternately: one-way latency of an 8-byte ping-pong (microseconds, median of
# the run) and bandwidth at 8 B, 64 KiB and 4 MiB (MiB/s, all bytes over all time). UCX with
# peer-failure detection on (tcp, as pipetrain runs it by default) and off (shared memory).
# Prints, per figure, the median over REPEAT runs and the range.
#
#   bench/transport_gloo.sh [build-dir]      (default: build)
#   REPEAT=5 ITERS=4000 bench/transport_gloo.sh build
set -euo pipefail

build=${1:-build}
bench=$build/bench/transport_bench
repeat=${REPEAT:-3}
iters=${ITERS:-4000}
[[ -x $bench ]] || { echo "no $bench: build the transport_bench target" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

variants=("gloo|--backend gloo" "ucx-tcp|--backend ucx" "ucx-sm|--backend ucx --no-peer-failure-detection")
for i in $(seq "$repeat"); do
  for v in "${variants[@]}"; do
    name=${v%%|*}
    # shellcheck disable=SC2086
    timeout 300 "$bench" ${v#*|} --iters "$iters" > "$work/$name.$i" 2> "$work/$name.$i.err" ||
      { echo "$name run $i failed:"; cat "$work/$name.$i.err"; }
  done
done

python3 - "$work" "$repeat" <<'PY'
import statistics, sys
work, repeat = sys.argv[1], int(sys.argv[2])
names = {"gloo": "c10d gloo (tcp)", "ucx-tcp": "ucx, tcp (detection on)", "ucx-sm": "ucx, shared memory (detection off)"}
figures = {}  # (variant, figure) -> [values]
for v in names:
    for i in range(1, repeat + 1):
        try:
            lines = open(f"{work}/{v}.{i}").read().split("\n")
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) >= 3 and f[0] == "latency":
                figures.setdefault((v, "latency 8 B (us)"), []).append(float(f[2]))
            elif len(f) >= 4 and f[0] == "bandwidth":
                figures.setdefault((v, f"bandwidth {int(f[1])} B (MiB/s)"), []).append(float(f[3]))
rows = sorted({k[1] for k in figures}, key=lambda r: (not r.startswith("latency"), int(r.split()[1])))
print(f"median of {repeat} alternating runs [range]")
print("| figure | " + " | ".join(names.values()) + " | gloo / ucx tcp |")
print("|---|" + "---|" * (len(names) + 1))
def cell(v, r):
    xs = figures.get((v, r), [])
    return f"{statistics.median(xs):.1f} [{min(xs):.1f}-{max(xs):.1f}]" if xs else "n/a"
for r in rows:
    g, u = figures.get(("gloo", r)), figures.get(("ucx-tcp", r))
    ratio = f"{statistics.median(g) / statistics.median(u):.2f}" if g and u else "-"
    print(f"| {r} | " + " | ".join(cell(v, r) for v in names) + f" | {ratio} |")
PY
