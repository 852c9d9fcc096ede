#!/usr/bin/env bash
# Installs what pipetrain needs: Debian packages, and PyTorch's own libtorch (the torch wheel
# from PyPI, pinned, in a virtual environment outside the clone; see scripts/env.sh).
# Idempotent: when everything is present it only checks (well under a second).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"

# ucx-utils: ucx_perftest for the transport benchmark; openmpi: mpirun launches; fortunes: the
# text the byte-level language model config trains on; iproute2: the two-namespace test makes
# its network with `ip`; clang and libclang-rt-14-dev: the fuzz targets (libFuzzer, sanitizers);
# libgloo-dev: the declarations of libtorch's Gloo process group (the wheel has the library, not
# gloo's headers); doxygen: the API reference and its check (scripts/apidocs.sh);
# libbenchmark-dev: Google Benchmark, which times the partitioner (bench/partition_speed.cpp);
# libspdlog-dev: the levelled, rank-prefixed messages (common/log.h); ccache: a second clone
# (or a clean rebuild) compiles from the cache outside the clone (scripts/build.sh).
packages=(
  build-essential cmake pkg-config zlib1g-dev
  nlohmann-json3-dev libcli11-dev googletest libgtest-dev libbenchmark-dev libspdlog-dev
  libucx-dev ucx-utils libgloo-dev doxygen
  openmpi-bin libopenmpi-dev iproute2
  dataset-fashion-mnist
  fortunes
  clang libclang-rt-14-dev
  ccache
)
# A Python without ensurepip (Debian's, before python3-venv) cannot make the environment.
if ! python3 -c 'import ensurepip' 2>/dev/null; then packages+=(python3-venv); fi

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

# PyTorch's libtorch: the torch wheel and its CUDA libraries (about 3 GB), once per machine.
if [ -z "${PIPETRAIN_TORCH_PYTHON:-}" ] && [ ! -f "$PIPETRAIN_VENV_READY" ]; then
  mkdir -p "$PIPETRAIN_CACHE"
  exec 9>"$PIPETRAIN_CACHE/.lock"
  flock -w 1800 9 || { echo "setup: another set-up holds $PIPETRAIN_CACHE/.lock" >&2; exit 1; }
  if [ ! -f "$PIPETRAIN_VENV_READY" ]; then  # not made meanwhile by the holder of the lock
    echo "setup: installing torch $PIPETRAIN_TORCH_VERSION from PyPI into $PIPETRAIN_VENV"
    start=$(date +%s)
    rm -rf "$PIPETRAIN_VENV"  # a half-made environment from an interrupted set-up
    python3 -m venv "$PIPETRAIN_VENV"
    "$PIPETRAIN_VENV/bin/python3" -m pip install --disable-pip-version-check --no-input \
      "torch==$PIPETRAIN_TORCH_VERSION" numpy tensorboard
    "$PIPETRAIN_VENV/bin/python3" - "$PIPETRAIN_TORCH_VERSION" <<'EOF' >"$PIPETRAIN_VENV_READY.tmp"
import sys, torch
want = sys.argv[1]
if torch.__version__.split("+")[0] != want:
    sys.exit(f"setup: torch {torch.__version__} installed, {want} wanted")
print(torch.utils.cmake_prefix_path)
EOF
    mv "$PIPETRAIN_VENV_READY.tmp" "$PIPETRAIN_VENV_READY"
    echo "setup: torch $PIPETRAIN_TORCH_VERSION ready in $(( $(date +%s) - start )) s"
  fi
  exec 9>&-
fi

# pip_add NAME CHECK PIP-ARGS...: what the tests and examples need from PyPI beyond torch, added
# to the project's environment (also one made before it was needed) unless the Python statement
# CHECK already succeeds; the marker NAME saves running CHECK on every set-up.
pip_add() {
  local marker="$PIPETRAIN_VENV/.pipetrain-$1" check=$2
  shift 2
  if [ -n "${PIPETRAIN_TORCH_PYTHON:-}" ] || [ -f "$marker" ]; then return 0; fi
  exec 9>"$PIPETRAIN_CACHE/.lock"
  flock -w 1800 9 || { echo "setup: another set-up holds $PIPETRAIN_CACHE/.lock" >&2; exit 1; }
  if ! "$PIPETRAIN_VENV/bin/python3" -c "$check" 2>/dev/null; then
    echo "setup: installing ${*: -1} from PyPI into $PIPETRAIN_VENV"
    "$PIPETRAIN_VENV/bin/python3" -m pip install --disable-pip-version-check --no-input -q "$@"
  fi
  touch "$marker"
  exec 9>&-
}

# TensorBoard's own reader, for the test that reads pipetrain's event files back.
pip_add tensorboard 'import tensorboard' tensorboard
# UCX with CUDA (cuda_copy, cuda_ipc: device memory between processes) from PyPI's libucx-cu13
# wheel; the build finds it through the wheel's CMake files (scripts/build.sh) and falls back to
# Debian's UCX (no CUDA) where it is absent.
pip_add "ucx-$PIPETRAIN_UCX_WHEEL_VERSION" \
  "import libucx, sys; sys.exit(libucx.__version__ != '$PIPETRAIN_UCX_WHEEL_VERSION')" \
  --no-deps "libucx-cu13==$PIPETRAIN_UCX_WHEEL_VERSION"
# Python's own safetensors, for the tests that exchange files with it (tests/safetensors_test.cpp).
pip_add safetensors 'import safetensors' safetensors
# transformers and tokenizers: the oracle of the hf family's tests (tests/hf_models.py) and the
# fine-tuning example (examples/hf_finetune); the versions the tests were written against.
pip_add "transformers-$PIPETRAIN_TRANSFORMERS_VERSION" \
  "import transformers, tokenizers, sys; sys.exit(transformers.__version__ != '$PIPETRAIN_TRANSFORMERS_VERSION')" \
  "tokenizers==$PIPETRAIN_TOKENIZERS_VERSION" "transformers==$PIPETRAIN_TRANSFORMERS_VERSION"
# accelerate: transformers reads a quantized checkpoint (fp8, MXFP4) only with it; the oracle
# of the hf family's quantized cases (HfParity.*Dequantized) loads them so.
pip_add "accelerate-$PIPETRAIN_ACCELERATE_VERSION" \
  "import accelerate, sys; sys.exit(accelerate.__version__ != '$PIPETRAIN_ACCELERATE_VERSION')" \
  "accelerate==$PIPETRAIN_ACCELERATE_VERSION"
# compressed-tensors: transformers reads llm-compressor's checkpoints (W4A16, W8A8, FP8, NVFP4)
# with it; the oracle writes the hf family's compressed cases with its compressors.
pip_add "compressed-tensors-$PIPETRAIN_COMPRESSED_TENSORS_VERSION" \
  "import compressed_tensors, sys; sys.exit(compressed_tensors.__version__ != '$PIPETRAIN_COMPRESSED_TENSORS_VERSION')" \
  "compressed-tensors==$PIPETRAIN_COMPRESSED_TENSORS_VERSION"
# peft: the oracle of the hf family's LoRA adapters (tests/hf_lora.py), which loads the adapters
# `export --format peft` writes.
pip_add "peft-$PIPETRAIN_PEFT_VERSION" \
  "import peft, sys; sys.exit(peft.__version__ != '$PIPETRAIN_PEFT_VERSION')" \
  --no-deps "peft==$PIPETRAIN_PEFT_VERSION"
