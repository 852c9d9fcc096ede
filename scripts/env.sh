# Sourced by the other scripts: where PyTorch's libtorch lives.
#
# The torch wheel from PyPI (libtorch with CUDA, cuDNN and NCCL inside) is installed into a
# virtual environment outside the clone, keyed by the torch and Python versions, so that every
# clone and every CI run on a machine shares one download.
#   PIPETRAIN_TORCH_VERSION  the pinned torch version (that of the GPU machines)
#   PIPETRAIN_CACHE          the cache folder (default ~/.cache/pipetrain)
#   PIPETRAIN_TORCH_PYTHON   a python3 whose torch to build against instead of the virtual
#                            environment (scripts/gpu.sh sets it on a GPU machine)
PIPETRAIN_TORCH_VERSION=${PIPETRAIN_TORCH_VERSION:-2.11.0}
# UCX with CUDA from PyPI (libucx-cu13), pinned.
PIPETRAIN_UCX_WHEEL_VERSION=${PIPETRAIN_UCX_WHEEL_VERSION:-1.22.0}
# transformers, tokenizers, accelerate, compressed-tensors and peft from PyPI (scripts/setup.sh): the hf family's test oracle and example.
PIPETRAIN_TRANSFORMERS_VERSION=${PIPETRAIN_TRANSFORMERS_VERSION:-5.24.0}
PIPETRAIN_TOKENIZERS_VERSION=${PIPETRAIN_TOKENIZERS_VERSION:-0.23.3}
PIPETRAIN_ACCELERATE_VERSION=${PIPETRAIN_ACCELERATE_VERSION:-1.15.0}
PIPETRAIN_COMPRESSED_TENSORS_VERSION=${PIPETRAIN_COMPRESSED_TENSORS_VERSION:-0.20.1}
PIPETRAIN_PEFT_VERSION=${PIPETRAIN_PEFT_VERSION:-0.21.2}
PIPETRAIN_CACHE=${PIPETRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pipetrain}
pipetrain_py=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
PIPETRAIN_VENV=${PIPETRAIN_VENV:-$PIPETRAIN_CACHE/torch-$PIPETRAIN_TORCH_VERSION-py$pipetrain_py}
# Written last by scripts/setup.sh: the venv is complete once this file exists.
PIPETRAIN_VENV_READY=$PIPETRAIN_VENV/.pipetrain-ready

# The python3 whose torch the build and the Python-side tests use.
pipetrain_python() {
  if [ -n "${PIPETRAIN_TORCH_PYTHON:-}" ]; then
    echo "$PIPETRAIN_TORCH_PYTHON"
  else
    echo "$PIPETRAIN_VENV/bin/python3"
  fi
}

# torch's CMake package folder (what torch.utils.cmake_prefix_path names).
pipetrain_torch_cmake() {
  if [ -z "${PIPETRAIN_TORCH_PYTHON:-}" ] && [ -f "$PIPETRAIN_VENV_READY" ]; then
    cat "$PIPETRAIN_VENV_READY"  # saved by setup: saves importing torch on every build
  else
    "$(pipetrain_python)" -c 'import torch; print(torch.utils.cmake_prefix_path)'
  fi
}

# The libucx-cu13 wheel's UCX prefix (lib/cmake/ucx inside), where that wheel is installed; empty
# otherwise. PIPETRAIN_UCX_PREFIX names another (a GPU machine's unpacked copy).
pipetrain_ucx_prefix() {
  if [ -n "${PIPETRAIN_UCX_PREFIX:-}" ]; then
    echo "$PIPETRAIN_UCX_PREFIX"
  else
    "$(pipetrain_python)" -c 'import os, libucx; print(os.path.dirname(libucx.__file__))' 2>/dev/null || true
  fi
}
