#!/usr/bin/env bash
# Builds the fuzz targets with clang (fuzz/CMakeLists.txt) and runs each for SECONDS over its
# seed corpus (fuzz/corpus/<target>/) and the inputs of earlier crashes (fuzz/regressions/<target>/,
# each run once first: a regression fails at once). New inputs go to a scratch corpus, crashes to
# build-fuzz/crashes/. Prints one line per target: executions, corpus size, crashes.
#
#   bash fuzz/run.sh [SECONDS] [TARGET ...]     # CI runs 5 seconds each; see docs for longer runs
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
seconds=${1:-10}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config_fuzz layers_fuzz wire_fuzz manifest_fuzz shard_fuzz costs_fuzz records_fuzz safetensors_fuzz safetensors_index_fuzz token_file_fuzz ucx_address_fuzz)
build=${PIPETRAIN_FUZZ_BUILD:-$root/build-fuzz}
cxx=${PIPETRAIN_FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || true)}
[ -n "$cxx" ] || { echo "fuzz: clang++ not found (scripts/setup.sh installs clang)" >&2; exit 1; }
torch_cmake=$(pipetrain_torch_cmake)
# ccache, where installed, as scripts/build.sh uses it: a second clone builds the instrumented
# targets from the cache outside the clone.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=true
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
mkdir -p "$build"
cmake -S "$root/fuzz" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$torch_cmake" \
  -DTorch_DIR="$torch_cmake/Torch" "${launcher[@]}" >"$build/configure.log" 2>&1 || { cat "$build/configure.log" >&2; exit 1; }
# ucx_address_fuzz exists only where UCX and spdlog are installed (fuzz/CMakeLists.txt).
if ! cmake --build "$build" --target help 2>/dev/null | grep -q ucx_address_fuzz; then
  kept=()
  for t in "${targets[@]}"; do
    if [ "$t" = ucx_address_fuzz ]; then echo "ucx_address_fuzz: skipped (UCX or spdlog not installed)"; else kept+=("$t"); fi
  done
  targets=("${kept[@]}")
fi
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >"$build/build.log" 2>&1 ||
  { tail -40 "$build/build.log" >&2; exit 1; }

# Allocations beyond the limit fail as they would in a process (std::bad_alloc) rather than
# ending the run: a reader must turn them into its error.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
status=0
mkdir -p "$build/crashes"
for t in "${targets[@]}"; do
  regressions=("$root/fuzz/regressions/$t"/*)
  if [ -e "${regressions[0]}" ]; then
    "$build/$t" "${regressions[@]}" >"$build/$t.regressions.log" 2>&1 ||
      { echo "$t: an earlier crash input fails again (see $build/$t.regressions.log)"; status=1; continue; }
  fi
  # libtorch's zip reader leaks its central directory when an archive is malformed
  # (mz_zip_reader_init, then a throw without mz_zip_reader_end): a leak inside libtorch on a
  # path that ends the load with an error, so leaks are not checked for the shard reader.
  # It also allocates a record's size as the zip directory claims it (up to 4 GB when forged)
  # before the read fails: untouched memory, so for the shard reader only resident memory is
  # bounded (rss_limit_mb), not the size of one allocation.
  leaks=1 malloc_limit=2048
  if [ "$t" = shard_fuzz ]; then leaks=0 malloc_limit=1048576; fi
  work=$(mktemp -d "$build/corpus-$t.XXXXXX")
  log=$build/$t.log
  if ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=$leaks" "$build/$t" "$work" "$root/fuzz/corpus/$t" \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -malloc_limit_mb=$malloc_limit \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="$build/crashes/$t-" >"$log" 2>&1; then
    result=ok
  else
    result="CRASH (input in $build/crashes/, log $log)"
    status=1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  printf '%-14s %8s executions in %ss, corpus %s inputs: %s\n' "$t" "${runs:-?}" "$seconds" \
    "$(ls "$work" | wc -l)" "$result"
  rm -rf "$work"
done
exit $status
