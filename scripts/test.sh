#!/usr/bin/env bash
# Quick start, command 2: builds everything (host code, MPI tests, the CUDA code when nvcc is
# present, and the CUDA tests for the CPU emulator of tests/emu) and runs the host, MPI and emulated
# CUDA tests. The real GPU tests (label cuda) run with `ctest -L cuda` on a machine with a GPU;
# without one they report as skipped.
#
#   scripts/test.sh             Release build in build/, ctest -L 'host|mpi|emu'
#   scripts/test.sh --sanitize  host and emu tests under AddressSanitizer + UndefinedBehaviorSanitizer
#                               in build-sanitize/
#   scripts/test.sh --tsan      the emulated kernel and stream tests under ThreadSanitizer in build-tsan/
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
moe_install_missing_packages
moe_install_missing_python_packages
jobs=$(moe_jobs)

if [ "${1:-}" = "--sanitize" ]; then
  build=${MOE_BUILD_DIR:-build-sanitize}
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOE_SANITIZE=ON -DMOE_ENABLE_CUDA=OFF -DMOE_REQUIRE_TEST_DEPS=ON \
        -DMOE_BUILD_EXAMPLES=OFF -DMOE_BUILD_BENCHMARKS=OFF
  cmake --build "$build" -j"$jobs"
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  ctest --test-dir "$build" -L 'host|emu' -E 'headers_compile_alone|consumer_project' --output-on-failure -j"$jobs"
  exit 0
fi

if [ "${1:-}" = "--tsan" ]; then
  build=${MOE_BUILD_DIR:-build-tsan}
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOE_SANITIZE=thread -DMOE_ENABLE_CUDA=OFF -DMOE_REQUIRE_TEST_DEPS=ON \
        -DMOE_AREAS=emu -DMOE_BUILD_EXAMPLES=OFF -DMOE_BUILD_BENCHMARKS=OFF
  cmake --build "$build" -j"$jobs"
  export TSAN_OPTIONS=halt_on_error=0:second_deadlock_stack=1
  ctest --test-dir "$build" -L emu_tsan --output-on-failure -j"$jobs"
  exit 0
fi

build=${MOE_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOE_REQUIRE_TEST_DEPS=ON
cmake --build "$build" -j"$jobs"
ctest --test-dir "$build" -L 'host|mpi|emu' --output-on-failure -j"$jobs"
