#!/usr/bin/env bash
# Quick start: set up, build, and train the default config (or the arguments given).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
build=${PIPETRAIN_BUILD_DIR:-$root/build}
if [ "$#" -eq 0 ]; then set -- train "$root/configs/fashion_mnist_cnn.json"; fi
exec "$build/apps/pipetrain" "$@"
