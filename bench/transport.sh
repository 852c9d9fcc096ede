#!/usr/bin/env bash
# The UCX transport through pipetrain's Transport API (bench/transport_bench: two processes,
# tensors with the wire header, allocation of every received tensor) next to ucx_perftest (UCX's
# own benchmark on the raw UCP tag API, one preallocated buffer) on the same UCX transports.
# Latency: one-way microseconds of an 8-byte ping-pong (median; ucx_perftest's 50th percentile).
# Bandwidth: MiB/s (2^20 B/s, what ucx_perftest labels MB/s), all bytes over all time.
# Peer failure mode: pipetrain's TransportOptions::detect_peer_failure, ucx_perftest's -e (UCX
# cannot use shared memory with it, so "sm" runs only without).
#
#   bench/transport.sh [build-dir]        (default: build; needs ucx-utils for ucx_perftest)
#   REPEAT=5 bench/transport.sh build     (5 runs of each figure: median and best; default 3)
set -euo pipefail

build=${1:-build}
bench=$build/bench/transport_bench
repeat=${REPEAT:-3}
port=${PORT:-13555}
sizes=(8 65536 4194304)
[[ -x $bench ]] || { echo "no $bench: build the transport_bench target" >&2; exit 1; }
have_perftest=1
command -v ucx_perftest > /dev/null || { have_perftest=0; echo "ucx_perftest not found (package ucx-utils): its columns stay empty" >&2; }

# ucx_perftest <tls> <extra flags> <test> <size> <iters>: prints the Final line's figures.
perftest() {
  local tls=$1 flags=$2 test=$3 size=$4 iters=$5 out
  UCX_TLS=$tls timeout 120 ucx_perftest -t "$test" -s "$size" -n "$iters" -w $((iters / 10 + 1)) -p "$port" $flags \
    > /dev/null 2>&1 &
  local server=$!
  for _ in $(seq 50); do  # the server listens within a few hundred milliseconds
    out=$(UCX_TLS=$tls timeout 120 ucx_perftest 127.0.0.1 -t "$test" -s "$size" -n "$iters" -w $((iters / 10 + 1)) \
            -p "$port" $flags 2>/dev/null | grep '^Final:' || true)
    [[ -n $out ]] && break
    sleep 0.1
  done
  wait "$server" || true
  port=$((port + 1))
  echo "$out"
}

# Of several runs: "median best" (best: lowest latency, highest bandwidth).
summary() {  # <lat|bw>
  { grep -E '^[0-9.]+$' || true; } | sort -g | awk -v kind="$1" '{ v[++n] = $1 } END {  # failed runs print nothing
    if (n == 0) { print "n/a n/a"; exit }
    med = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    best = kind == "lat" ? v[1] : v[n]
    printf "%.1f %.1f\n", med, best }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }

row() {  # <label> <UCX_TLS> <our flags> <perftest flags>
  local label=$1 tls=$2 ours=$3 theirs=$4
  local runs=() i
  for ((i = 0; i < repeat; i++)); do runs+=("$(UCX_TLS=$tls timeout 600 "$bench" --iters 5000 $ours)"); done
  local o p
  o=($(printf '%s\n' "${runs[@]}" | awk '$1 == "latency" {print $3}' | summary lat))
  p=(n/a n/a)
  if ((have_perftest)); then
    p=($(for ((i = 0; i < repeat; i++)); do perftest "$tls" "$theirs" tag_lat 8 20000 | awk '{print $3}'; done | summary lat))
  fi
  printf '%-28s %-11s %9s %9s %9s %9s %6s\n' "$label" "lat 8 B" "${o[0]}" "${o[1]}" "${p[0]}" "${p[1]}" \
    "$(ratio "${o[0]}" "${p[0]}")"
  for size in "${sizes[@]}"; do
    local iters
    iters=$((size >= 1048576 ? 400 : size >= 65536 ? 20000 : 200000))
    o=($(printf '%s\n' "${runs[@]}" | awk -v s="$size" '$1 == "bandwidth" && $2 == s {print $4}' | summary bw))
    p=(n/a n/a)
    if ((have_perftest)); then
      p=($(for ((i = 0; i < repeat; i++)); do perftest "$tls" "$theirs" tag_bw "$size" "$iters" | awk '{print $7}'; done | summary bw))
    fi
    printf '%-28s %-11s %9s %9s %9s %9s %6s\n' "" "bw $size" "${o[0]}" "${o[1]}" "${p[0]}" "${p[1]}" \
      "$(ratio "${o[0]}" "${p[0]}")"
  done
}

echo "runs per figure: $repeat; latency: one-way us (lower is better); bandwidth: MiB/s (higher is better)"
printf '%-28s %-11s %9s %9s %9s %9s %6s\n' "" "" "pipetrain" "" "perftest" "" "ratio"
printf '%-28s %-11s %9s %9s %9s %9s %6s\n' "UCX_TLS (peer failure mode)" "measure" "median" "best" "median" "best" "median"
row "tcp (on; perftest -e)" tcp "" "-e"
row "tcp (off)" tcp "--no-peer-failure-detection" ""
row "sm (off)" sm "--no-peer-failure-detection" ""
row "all (on; perftest -e)" all "" "-e"
row "all (off)" all "--no-peer-failure-detection" ""
