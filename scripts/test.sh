#!/usr/bin/env bash
# Quick start, command 2: builds everything (host code, MPI tests, and the CUDA code when nvcc is
# present) and runs the host and MPI tests. GPU tests (label cuda) run with `ctest -L cuda` on a
# machine with a GPU; without one they report as skipped.
#
#   scripts/test.sh             Release build in build/, ctest -L 'host|mpi'
#   scripts/test.sh --sanitize  host tests under AddressSanitizer + UndefinedBehaviorSanitizer in build-sanitize/
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
moe_install_missing_packages
jobs=$(moe_jobs)

if [ "${1:-}" = "--sanitize" ]; then
  build=${MOE_BUILD_DIR:-build-sanitize}
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOE_SANITIZE=ON -DMOE_ENABLE_CUDA=OFF \
        -DMOE_BUILD_EXAMPLES=OFF -DMOE_BUILD_BENCHMARKS=OFF
  cmake --build "$build" -j"$jobs"
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  ctest --test-dir "$build" -L host -E 'headers_compile_alone|consumer_project' --output-on-failure -j"$jobs"
  exit 0
fi

build=${MOE_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j"$jobs"
ctest --test-dir "$build" -L 'host|mpi' --output-on-failure -j"$jobs"
