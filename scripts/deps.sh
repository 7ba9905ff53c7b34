# Sourced by the other scripts: installs the Debian packages moe-compose builds and tests with,
# when they are missing, and the Python packages the tests use. Nothing is fetched from anywhere but
# the Debian archive and PyPI.
#
# MOE_BUILD_PACKAGES: what the library, the demo and the planner programs need (the engine formats
# of moe::interop read JSON, YAML and zip; moe::mpi uses OpenMPI). MOE_TEST_PACKAGES: what only the
# tests and benchmarks need (Catch2, Google Benchmark, the oracles GLPK, LEMON, METIS and SimGrid,
# which also serves the optional simgrid_compare tool, ccache for the repeated builds of
# scripts/test.sh, pip for the Python test packages below).
MOE_BUILD_PACKAGES=(cmake g++ make libopenmpi-dev openmpi-bin nlohmann-json3-dev libyaml-cpp-dev libzip-dev)
MOE_TEST_PACKAGES=(catch2 libbenchmark-dev liblemon-dev libglpk-dev libmetis-dev libsimgrid-dev ccache python3
                   python3-pip)
MOE_DEBIAN_PACKAGES=("${MOE_BUILD_PACKAGES[@]}" "${MOE_TEST_PACKAGES[@]}")

moe_install_missing_packages() {
  local missing=()
  for p in "${MOE_DEBIAN_PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "moe: installing missing Debian packages: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# Python packages the tests use (from PyPI when the python3 on PATH lacks them): PyYAML, the
# independent reader of the TensorRT-LLM plan files in tests/planners/engine_load_check.py;
# scikit-build-core, nanobind, numpy, pytest and hypothesis for the moe_compose package and its tests
# (tests/python); and
# nvidia-cutlass, whose CuTe headers are the oracle of the emulator's sm_90 swizzle, descriptor and
# fragment models (tests/emu/hopper.cmake; CuTe also needs libcu++ and <cuda_fp16.h>: from the CUDA
# toolkit where there is one, else from the PyPI packages nvidia-cuda-cccl and nvidia-cuda-runtime).
moe_pip_install() {
  python3 -m pip install -q "$@" || python3 -m pip install -q --break-system-packages "$@"
}
moe_install_missing_python_packages() {
  local missing=()
  python3 -c "import yaml" >/dev/null 2>&1 || missing+=(pyyaml)
  # The moe_compose package (python/): its build backend and bindings generator, and the test tools
  # of tests/python (pytest, hypothesis; numpy is the package's one runtime dependency).
  python3 -c "import scikit_build_core" >/dev/null 2>&1 || missing+=(scikit-build-core)
  python3 -c "import nanobind" >/dev/null 2>&1 || missing+=(nanobind)
  python3 -c "import numpy" >/dev/null 2>&1 || missing+=(numpy)
  python3 -c "import pytest" >/dev/null 2>&1 || missing+=(pytest)
  python3 -c "import hypothesis" >/dev/null 2>&1 || missing+=(hypothesis)
  python3 -c "import cutlass_library" >/dev/null 2>&1 || missing+=(nvidia-cutlass)
  if [ ! -e /usr/local/cuda/include/cccl/cuda/std/utility ] && [ ! -e /usr/local/cuda/include/cuda/std/utility ] &&
     ! python3 -c "import nvidia, os, sys; sys.exit(not any(os.path.exists(os.path.join(p, d, 'include', s, 'cuda/std/utility')) for p in nvidia.__path__ for d in os.listdir(p) for s in ('', 'cccl')))" >/dev/null 2>&1; then
    missing+=(nvidia-cuda-cccl nvidia-cuda-runtime)
  fi
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "moe: installing missing Python packages: ${missing[*]}"
  moe_pip_install "${missing[@]}"
}

# ccache (Debian) as the compiler launcher, where it is installed and MOE_NO_CCACHE is unset: the
# scripts' builds keep their objects between runs, and paths under this checkout (the current
# directory) are hashed relative to it, so that a fresh clone elsewhere hits the same entries. Sets
# MOE_CCACHE (a command prefix: (ccache) or ()) and MOE_CMAKE_LAUNCHER (CMake's two launcher
# arguments, or their removal from a build folder that had them).
moe_use_ccache() {
  if command -v ccache >/dev/null 2>&1 && [ -z "${MOE_NO_CCACHE:-}" ]; then
    export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}
    MOE_CCACHE=(ccache)
    MOE_CMAKE_LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  else
    MOE_CCACHE=()
    MOE_CMAKE_LAUNCHER=(-UCMAKE_CXX_COMPILER_LAUNCHER -UCMAKE_CUDA_COMPILER_LAUNCHER)
  fi
}

moe_jobs() {
  nproc 2>/dev/null || echo 2
}
