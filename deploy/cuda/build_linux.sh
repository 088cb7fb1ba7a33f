#!/usr/bin/env bash
# Rebuild llama-cpp-python 0.3.36 with llama.cpp's CUDA backend, in the venv that runs the daemon.
#
#   deploy/cuda/build_linux.sh [ARCHITECTURES]        # default: native (the GPUs this machine has)
#   deploy/cuda/build_linux.sh "86;89;120"            # RTX 30xx, 40xx, 50xx: a build to ship
#
# Needs the CUDA toolkit (nvcc on PATH or CUDACXX=/usr/local/cuda/bin/nvcc), CMake 3.21+, a C++
# compiler. Environment: PYTHON (default .venv/bin/python), JOBS (default: all cores),
# LLAMA_CPP_PYTHON_SOURCE (an unpacked llama-cpp-python 0.3.36 sdist, for machines without PyPI;
# then scikit-build-core and cmake must already be installed in the venv), NATIVE_CPU=off to build
# for any x86-64 CPU (a wheel built with the default -march=native only runs on CPUs like this one).
set -euo pipefail
cd "$(dirname "$0")/../.."

arch=${1:-native}
python=${PYTHON:-.venv/bin/python}
jobs=${JOBS:-$(nproc)}

if ! command -v nvcc >/dev/null && [ -z "${CUDACXX:-}" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    export CUDACXX=/usr/local/cuda/bin/nvcc
  else
    echo "build_linux.sh: nvcc not found: install the CUDA toolkit or set CUDACXX" >&2
    exit 2
  fi
fi

cmake_args="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${arch}"
if [ "${NATIVE_CPU:-on}" = "off" ]; then
  cmake_args="$cmake_args -DGGML_NATIVE=off"
fi
export CMAKE_ARGS="$cmake_args"
export CMAKE_BUILD_PARALLEL_LEVEL="$jobs"

echo "building llama-cpp-python with CMAKE_ARGS=\"$CMAKE_ARGS\" ($jobs jobs)" >&2
started=$(date +%s)
if [ -n "${LLAMA_CPP_PYTHON_SOURCE:-}" ]; then
  "$python" -m pip install --force-reinstall --no-deps --no-build-isolation --no-cache-dir "$LLAMA_CPP_PYTHON_SOURCE"
else
  # --no-deps: only llama.cpp changes; numpy, jinja2 and the rest stay as the venv has them.
  "$python" -m pip install --force-reinstall --no-deps --no-cache-dir "llama-cpp-python==0.3.36"
fi

lib=$("$python" -c 'import importlib.util, pathlib; s = importlib.util.find_spec("llama_cpp"); print(pathlib.Path(next(iter(s.submodule_search_locations))) / "lib")')
if ! ls "$lib"/libggml-cuda* >/dev/null 2>&1; then
  echo "build_linux.sh: the build finished but $lib has no libggml-cuda: CUDA was not enabled" >&2
  exit 1
fi
echo "llama-cpp-python with CUDA in $(( $(date +%s) - started )) s: $(ls "$lib"/libggml-cuda*)" >&2
# The profile is keyed by the llama.cpp build: measure the new one now, not at the daemon's first start.
if ! "$python" -m sidecar profile --quick >/dev/null; then
  echo "build_linux.sh: warning: the quick profile failed; the daemon will retry it at start-up" >&2
fi
