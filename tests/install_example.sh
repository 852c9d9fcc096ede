#!/usr/bin/env bash
# Installs this build into a fresh prefix, builds examples/ out of tree against the installed
# package (find_package(pipetrain), pipetrain::pipetrain) and runs the examples and the installed
# binary. Arguments: the build folder and torch's CMake folder.
#
# The examples are built by the other compiler than the library's where both are installed (g++
# for a library built by clang++, clang++ for one built by g++), as an embedder whose compiler
# differs meets the package: embed_skip_tie's own layers stash and pop through the library's skip
# context, which must then be one object in the program.
set -euo pipefail
build=$1
torch_cmake=$2
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/pipetrain_install.XXXXXX")
trap 'rm -rf "$work"' EXIT

library_cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
if "$library_cxx" --version 2>/dev/null | grep -qi clang; then
  other=$(command -v g++ || true)
else
  other=$(command -v clang++ || true)
fi
example_cxx=${other:-$library_cxx}
echo "library built by $library_cxx; examples built by $example_cxx${other:+ (the other compiler)}"

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
"$work/prefix/bin/pipetrain" --version | head -1 | grep -q '^pipetrain ' ||
  { echo "the installed pipetrain does not run"; exit 1; }
cmake -S "$src/examples" -B "$work/example" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$example_cxx" \
  -DCMAKE_PREFIX_PATH="$work/prefix;$torch_cmake" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/example" -j 2 >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$work/example/embed_example"
"$work/example/embed_skip_tie"
