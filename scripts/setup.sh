#!/usr/bin/env bash
# Installs what pipetrain needs from Debian packages and makes OpenBLAS the BLAS that libtorch
# calls. Idempotent: when everything is present it only checks (well under a second).
set -euo pipefail

# ucx-utils: ucx_perftest for the transport benchmark; openmpi: mpirun launches; fortunes: the
# text the byte-level language model config trains on; python3-torch: the tests read exports
# with torch.load; iproute2: the two-namespace test makes its network with `ip`.
packages=(
  build-essential cmake pkg-config zlib1g-dev
  libtorch-dev nlohmann-json3-dev libcli11-dev googletest libgtest-dev
  libucx-dev ucx-utils
  openmpi-bin libopenmpi-dev iproute2
  libopenblas0-openmp
  dataset-fashion-mnist
  fortunes
  python3-torch
)

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# libtorch calls BLAS through the libblas.so.3 alternative; the reference BLAS is 15-30x slower.
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
alt="libblas.so.3-${arch}"
openblas="/usr/lib/${arch}/openblas-openmp/libblas.so.3"
if [ "$(readlink -f "/etc/alternatives/${alt}" 2>/dev/null)" != "$(readlink -f "$openblas")" ]; then
  echo "setup: selecting OpenBLAS for ${alt}"
  "${sudo_cmd[@]}" update-alternatives --set "$alt" "$openblas" >/dev/null
fi
