#!/usr/bin/env bash
# Installs this build into a fresh prefix, builds examples/ out of tree against the installed
# package (find_package(pipetrain), pipetrain::pipetrain) and runs the example and the installed
# binary. Arguments: the build folder and torch's CMake folder.
set -euo pipefail
build=$1
torch_cmake=$2
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/pipetrain_install.XXXXXX")
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
"$work/prefix/bin/pipetrain" --version | head -1 | grep -q '^pipetrain ' ||
  { echo "the installed pipetrain does not run"; exit 1; }
cmake -S "$src/examples" -B "$work/example" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix;$torch_cmake" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/example" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$work/example/embed_example"
