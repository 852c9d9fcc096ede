#!/usr/bin/env bash
# Run on a machine with Debian's package registry: downloads the Debian packages that a GPU
# machine without a registry lacks (nlohmann-json, CLI11, googletest, spdlog and fmt, UCX and the libraries UCX
# loads, gloo's headers; the Fashion-MNIST data for the default config's run) into .gpu-deps/, an
# ignored folder that travels with the tree; scripts/gpu.sh unpacks them there. About 35 MB, and
# the libucx-cu13 wheel's UCX (with CUDA) below.
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
# UCX with CUDA: the libucx-cu13 wheel's shared libraries, headers and CMake files (about 22 MB), unpacked into .gpu-deps/ucx-wheel; scripts/gpu.sh builds against it (UCX_CUDA=1).
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
wheel_dir=$(mktemp -d)
python3 -m pip download -q --no-deps "libucx-cu13==$PIPETRAIN_UCX_WHEEL_VERSION" -d "$wheel_dir" >/dev/null
rm -rf "$deps/ucx-wheel"
mkdir -p "$deps/ucx-wheel"
python3 - "$wheel_dir"/libucx_cu13-*.whl "$deps/ucx-wheel" <<'EOF'
import sys, zipfile, os
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        # A wheel holds each library three times (.so, .so.0, .so.0.0.0: no symbolic links in a
        # zip); only the .so.0 travels, and scripts/gpu.sh links the .so beside it.
        keep = (name.startswith("libucx/include/") or name.startswith("libucx/lib/cmake/")
                or name.startswith("libucx_cu13.libs/")
                or (name.startswith("libucx/lib/") and name.endswith(".so.0") and "perftest" not in name))
        if keep:
            z.extract(name, dest)
            info = z.getinfo(name)
            mode = info.external_attr >> 16
            if mode:
                os.chmod(os.path.join(dest, name), mode)
EOF
rm -rf "$wheel_dir"
echo "gpu_deps: $(ls "$deps"/*.deb | wc -l) packages and the UCX wheel's files, $(du -sh "$deps" | cut -f1) in $deps"
