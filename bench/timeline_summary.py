#!/usr/bin/env python3
"""Where the time of a traced step goes: per stage, the total of each kind of span in a
`pipetrain train --trace` file (forward, backward, recompute, receive waits, optimizer, idle)
and the median duration of one forward and one backward.

  bench/timeline_summary.py TRACE.json
"""
import collections
import json
import statistics
import sys

if len(sys.argv) != 2:
    sys.exit(__doc__)
with open(sys.argv[1]) as f:
    events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("pid") == 0]
by_stage = collections.defaultdict(list)
for e in events:
    by_stage[e["tid"]].append(e)
for stage, spans in sorted(by_stage.items()):
    start = min(e["ts"] for e in spans)
    end = max(e["ts"] + e["dur"] for e in spans)
    total = collections.Counter()
    durations = collections.defaultdict(list)
    for e in spans:
        total[e["cat"]] += e["dur"] / 1000.0
        durations[e["cat"]].append(e["dur"] / 1000.0)
    parts = ", ".join(f"{cat} {ms:.1f}" for cat, ms in total.most_common())
    med = ", ".join(f"{cat} {statistics.median(durations[cat]):.2f}"
                    for cat in ("forward", "backward", "backward_input", "backward_weight") if cat in durations)
    print(f"stage {stage}: {(end - start) / 1000.0:.1f} ms span; totals ms: {parts}; median per micro-batch ms: {med}")
