#!/usr/bin/env bash
# Builds the API reference of the headers an embedding program uses (docs/Doxyfile lists them)
# with Doxygen into OUT (default build/api; open OUT/html/index.html). Fails on any Doxygen
# warning, an undocumented public class, member or function included.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/api}
command -v doxygen >/dev/null || { echo "apidocs: doxygen is not installed (scripts/setup.sh installs it)" >&2; exit 77; }
rm -rf "$out" && mkdir -p "$out"
cd "$root"
if ! PIPETRAIN_API_OUT="$out" doxygen docs/Doxyfile 2>"$out/warnings.txt"; then
  cat "$out/warnings.txt" >&2
  echo "apidocs: the API reference has warnings (above)" >&2
  exit 1
fi
if [ -s "$out/warnings.txt" ]; then cat "$out/warnings.txt" >&2; exit 1; fi
echo "apidocs: $out/html/index.html"
