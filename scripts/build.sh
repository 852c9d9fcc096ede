#!/usr/bin/env bash
# Configures (Release) and builds pipetrain into build/ (or $PIPETRAIN_BUILD_DIR) against
# PyTorch's libtorch (scripts/env.sh says which). Extra arguments go to the configure step.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
build=${PIPETRAIN_BUILD_DIR:-$root/build}
mkdir -p "$build"
torch_cmake=$(pipetrain_torch_cmake)
# PIPETRAIN_EXTRA_PREFIX: another prefix to search for the dependencies (scripts/gpu.sh).
prefixes="$torch_cmake${PIPETRAIN_EXTRA_PREFIX:+;$PIPETRAIN_EXTRA_PREFIX}"
# UCX with CUDA from the libucx-cu13 wheel where installed (scripts/setup.sh); Debian's otherwise.
ucx_prefix=$(pipetrain_ucx_prefix)
# Torch_DIR is named explicitly so that a build folder configured against another libtorch
# (its cache remembers the old one) follows the current one.
# ccache, where installed: its cache lives outside the clone, and with the clone's root as its
# base directory a second clone of the same sources compiles from it (CI's clean clones).
# The precompiled header of libtorch is reused by every translation unit, so ccache may take it
# as it is (sloppiness) and the header must not carry a timestamp (CMakeLists.txt).
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=true
  export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
# The compiler: PIPETRAIN_CXX, or for a new build folder $CXX, else clang++ where installed, else
# the system's c++. clang instantiates libtorch's templates once, in the precompiled header,
# where g++ instantiates them again in every file: a first build takes about half the time (10
# min against 21 on 2 cores). A configured folder keeps its compiler unless PIPETRAIN_CXX names one.
compiler=()
if [ -n "${PIPETRAIN_CXX:-}" ]; then
  compiler=(-DCMAKE_CXX_COMPILER="$PIPETRAIN_CXX")
elif [ ! -f "$build/CMakeCache.txt" ] && [ -z "${CXX:-}" ] && command -v clang++ >/dev/null; then
  compiler=(-DCMAKE_CXX_COMPILER="$(command -v clang++)")
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "${compiler[@]}" \
  -DCMAKE_PREFIX_PATH="$prefixes" -DTorch_DIR="$torch_cmake/Torch" \
  -DPIPETRAIN_PYTHON="$(pipetrain_python)" -DPIPETRAIN_UCX_PREFIX="$ucx_prefix" "$@" >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log" >&2; exit 1; }
grep -E '^-- pipetrain' "$build/configure.log" || true
# PIPETRAIN_BUILD_TARGETS: only these targets (scripts/gpu.sh builds what its checks run).
targets=()
for t in ${PIPETRAIN_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
