#!/usr/bin/env bash
# Run on a machine with Debian's package registry: downloads the Debian packages that a GPU
# machine without a registry lacks (nlohmann-json, CLI11, googletest, spdlog and fmt, UCX and the libraries UCX
# loads, gloo's headers; the Fashion-MNIST data for the default config's run) into .gpu-deps/, an
# ignored folder that travels with the tree; scripts/gpu.sh unpacks them there. About 35 MB.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps=$root/.gpu-deps
packages=(nlohmann-json3-dev libcli11-dev googletest libgtest-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libucx0 libucx-dev
          libnuma1 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200 zlib1g-dev
          libgloo-dev dataset-fashion-mnist)
mkdir -p "$deps"
rm -f "$deps"/*.deb
# apt-get download writes into the current folder; -o APT::Architecture keeps it amd64, the GPU
# machines' processor, whatever this one is.
(cd "$deps" && apt-get download -q -o APT::Architecture=amd64 -o APT::Sandbox::User=root "${packages[@]/%/:amd64}" >/dev/null)
echo "gpu_deps: $(ls "$deps"/*.deb | wc -l) packages, $(du -sh "$deps" | cut -f1) in $deps"
