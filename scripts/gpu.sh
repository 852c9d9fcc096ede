#!/usr/bin/env bash
# Builds pipetrain on a machine with a GPU and Python's PyTorch but no package registry, runs
# the gpu tests (and with --all the whole suite) and the GPU benchmarks, and writes every log
# and result to one folder.
#
#   here (Debian registry):  bash scripts/gpu_deps.sh       # fetches .gpu-deps/ (travels along)
#   on the GPU machine:      bash scripts/gpu.sh [--all] [--phase build|test|bench] [RESULTS_DIR]
#
# RESULTS_DIR defaults to $OUT when set, else gpu-results/. The build uses the machine's own
# torch (python3's) and the Debian packages from .gpu-deps/, unpacked into .gpu-deps/root.
# Without --all it builds only what the GPU checks run (the binary, the gpu tests, the GPU
# benchmark). Each phase fits a 10-minute call, and a later phase reuses the build folder an
# earlier call left (while the machine is still warm). Without --phase it runs every phase in
# one call of at most $GPU_TOTAL_S seconds (default 560; a lent machine's device time is short
# and each start costs minutes): the build, then the gpu tests until $GPU_TEST_S seconds
# (default 240) or until only $GPU_BENCH_MIN_S (default 180) are left for the benchmarks, then
# the benchmarks with what is left (bench/gpu.sh skips, naming them in skipped.txt, the parts
# the time does not reach; `--phase bench` in a second call runs them).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
all=0
phase=all
while [ $# -gt 0 ]; do
  case "$1" in
    --all) all=1; shift ;;
    --phase) phase=$2; shift 2 ;;
    *) break ;;
  esac
done
want() { [ "$phase" = all ] || [ "$phase" = "$1" ]; }
out=${1:-${OUT:-$root/gpu-results}}
mkdir -p "$out"
deps=$root/.gpu-deps
prefix=$deps/root
arch=x86_64-linux-gnu
log() { echo "gpu.sh: $*" | tee -a "$out/summary.txt"; }
: >>"$out/summary.txt"

if ! ls "$deps"/*.deb >/dev/null 2>&1; then
  log "no packages in $deps: run scripts/gpu_deps.sh on a machine with Debian's registry first"
  exit 1
fi
rm -rf "$prefix" && mkdir -p "$prefix"
for f in "$deps"/*.deb; do
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$f" "$prefix"
  else  # a .deb is an ar archive holding data.tar.*
    (cd "$prefix" && ar p "$f" "$(ar t "$f" | grep '^data.tar')" | tar -x --auto-compress -f - 2>/dev/null ||
      ar p "$f" "$(ar t "$f" | grep '^data.tar')" | tar -xJ)
  fi
done
export LD_LIBRARY_PATH="$prefix/usr/lib/$arch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || log "nvidia-smi failed (see nvidia-smi.txt)"
export PIPETRAIN_TORCH_PYTHON=${PIPETRAIN_TORCH_PYTHON:-python3}
export PIPETRAIN_BUILD_DIR=${PIPETRAIN_BUILD_DIR:-$root/build-gpu}
export PIPETRAIN_EXTRA_PREFIX="$prefix/usr"
# UCX with CUDA from the libucx-cu13 wheel's files (scripts/gpu_deps.sh), where they came along.
if [ -f "$deps/ucx-wheel/libucx/lib/cmake/ucx/ucx-config.cmake" ]; then
  export PIPETRAIN_UCX_PREFIX="$deps/ucx-wheel/libucx"
  # One UCX in the picture: Debian's (1.13, no CUDA; there for a machine without the wheel's)
  # leaves the prefix, whose include folder the other packages' headers put on the compiler's
  # path ahead of the wheel's, and whose library folder, on LD_LIBRARY_PATH, comes before the
  # binary's run path (the wheel's libraries).
  rm -rf "$prefix"/usr/include/{ucm,ucp,ucs,uct} "$prefix"/usr/lib/$arch/libuc[mpst]* "$prefix"/usr/lib/$arch/ucx \
    "$prefix"/usr/lib/$arch/cmake/ucx "$prefix"/usr/lib/$arch/pkgconfig/ucx*
  for f in "$PIPETRAIN_UCX_PREFIX"/lib/*.so.0 "$PIPETRAIN_UCX_PREFIX"/lib/ucx/*.so.0; do
    [ -e "${f%.0}" ] || ln -s "$(basename "$f")" "${f%.0}"  # the link-time name; only .so.0 travels
  done
fi
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
if [ "$all" = 0 ]; then export PIPETRAIN_BUILD_TARGETS=${PIPETRAIN_BUILD_TARGETS:-"pipetrain gpu_test gpu_processes_test equivalence_test gpu_pipeline transfer_gpu"}; fi
start=$(date +%s)
deadline=$(( start + ${GPU_TOTAL_S:-560} ))
if want build && ! bash "$root/scripts/build.sh" "${generator[@]}" \
    -DGTest_DIR="$prefix/usr/lib/$arch/cmake/GTest" \
    -DCLI11_DIR="$(dirname "$(find "$prefix" -name 'CLI11Config.cmake' | head -1)")" \
    -Dnlohmann_json_DIR="$(dirname "$(find "$prefix" -name 'nlohmann_jsonConfig.cmake' | head -1)")" \
    -Dspdlog_DIR="$prefix/usr/lib/$arch/cmake/spdlog" -Dfmt_DIR="$prefix/usr/lib/$arch/cmake/fmt" \
    -DPIPETRAIN_WITH_CUDA=ON -DPIPETRAIN_WITH_NCCL="${PIPETRAIN_WITH_NCCL:-ON}" >"$out/build.log" 2>&1; then
  log "build failed after $(( $(date +%s) - start )) s (see build.log)"
  tail -30 "$out/build.log"
  exit 1
fi
want build && log "built in $(( $(date +%s) - start )) s"
bin=$PIPETRAIN_BUILD_DIR/apps/pipetrain
"$bin" --version | tee "$out/version.txt"

status=0
if want test; then
  # Four at a time: the two-process tests mostly wait on their processes' start, beside the CUDA grid.
  # Every phase in one call: the tests stop (ctest --stop-time: those running then time out, the
  # rest do not start) in time to leave the benchmarks theirs.
  stop=()
  if [ "$phase" = all ]; then
    until=$(( $(date +%s) + ${GPU_TEST_S:-240} ))
    [ "$until" -gt $(( deadline - ${GPU_BENCH_MIN_S:-180} )) ] && until=$(( deadline - ${GPU_BENCH_MIN_S:-180} ))
    stop=(--stop-time "$(date -d "@$until" +%H:%M:%S)")
  fi
  ctest --test-dir "$PIPETRAIN_BUILD_DIR" -N -L gpu | grep -E '^ +Test +#' >"$out/gpu-tests-listed.txt"
  ctest --test-dir "$PIPETRAIN_BUILD_DIR" -L gpu -j 4 --output-on-failure --timeout 600 "${stop[@]}" \
    >"$out/gpu-tests.log" 2>&1 || status=1
  log "gpu tests: $(grep -E 'tests passed|tests failed' "$out/gpu-tests.log" | tail -1) ($(wc -l <"$out/gpu-tests-listed.txt") listed, $(( $(date +%s) - start )) s into the call)"
  grep -E 'Skipped|\*\*\*' "$out/gpu-tests.log" | tee -a "$out/summary.txt"
fi
if want test && [ "$all" = 1 ]; then
  ctest --test-dir "$PIPETRAIN_BUILD_DIR" -LE gpu -j "$(nproc)" --output-on-failure --timeout 300 \
    >"$out/tests.log" 2>&1 || status=1
  log "whole suite: $(grep -E 'tests passed|tests failed' "$out/tests.log" | tail -1)"
fi
if want bench && [ -f "$root/bench/gpu.sh" ]; then
  [ "$phase" = all ] && export GPU_BENCH_BUDGET_S=$(( deadline - $(date +%s) ))
  bash "$root/bench/gpu.sh" "$PIPETRAIN_BUILD_DIR" "$out" >"$out/bench.log" 2>&1 || status=1
  log "benchmarks: see bench.log and the results beside it"
fi
exit $status
