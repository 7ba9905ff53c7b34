#!/usr/bin/env bash
# Quick start, command 2: builds everything (host code, MPI tests, the CUDA code when nvcc is
# present, and the CUDA tests for the CPU emulator of tests/emu) and runs the host, MPI and emulated
# CUDA tests. The real GPU tests (label cuda) run with `ctest -L cuda` on a machine with a GPU;
# without one they report as skipped.
#
#   scripts/test.sh             Release build in build/, ctest -L 'host|mpi|emu', then the Python
#                               package (pip install ./python) and pytest tests/python
#   scripts/test.sh --sanitize  host and emu tests under AddressSanitizer + UndefinedBehaviorSanitizer
#                               in build-sanitize/, compiled by clang (the other builds use g++); then
#                               scripts/clang_check.sh: the C++ that build leaves out, through clang's
#                               front end (-fsyntax-only -Werror)
#   scripts/test.sh --tsan      the emulated kernel and stream tests under ThreadSanitizer in build-tsan/
set -euo pipefail
cd "$(dirname "$0")/.."
# The repository's hooks (scripts/hooks: commit subjects of at most 72 characters) in a git checkout.
if git rev-parse --git-dir >/dev/null 2>&1; then git config core.hooksPath scripts/hooks || true; fi
source scripts/deps.sh
if [ "${1:-}" = "--sanitize" ]; then MOE_DEBIAN_PACKAGES+=(clang libclang-rt-dev); fi
moe_install_missing_packages
moe_install_missing_python_packages
jobs=$(moe_jobs)

# ccache (Debian) keeps the objects of the three builds below between runs: a second run of the same
# tree recompiles nothing that did not change (scripts/deps.sh, moe_use_ccache).
moe_use_ccache
cache=("${MOE_CMAKE_LAUNCHER[@]}")

if [ "${1:-}" = "--sanitize" ]; then
  build=${MOE_BUILD_DIR:-build-sanitize}
  # What this pass runs, and nothing more: the areas that own memory of their own (core, the layers,
  # the FinDEP executors, the emulated CUDA paths) and no MPI programs (the mpi label runs in the plain
  # build). The planners' and s-MoE's parsers run under ASan + UBSan in the fuzz stage (scripts/fuzz.sh);
  # their algorithms work on standard containers and run in the plain build. Headers alone are a
  # compile check of the plain build.
  # -O1 -g1 (line tables for the reports) for the emulated CUDA tests, whose kernels run long; -O0 for
  # the host tests, which run in seconds: ASan + UBSan at -O1 took test_planned_layer.cpp 151 s to
  # compile on the 2-core CI machine, at -O0 52 s.
  # Compiled by clang, so that the library, its tests and the emulator build with a second compiler
  # at no extra cost (clang 14 rejects what g++ 12 accepts, e.g. a lambda capturing a structured
  # binding); the other builds use the system's g++. (CMake configures a build folder made with
  # another compiler afresh.)
  cmake -S . -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOE_SANITIZE=ON -DMOE_ENABLE_CUDA=OFF -DMOE_REQUIRE_TEST_DEPS=ON \
        -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DMOE_HOST_TEST_OPT=-O0 \
        -DMOE_BUILD_EXAMPLES=OFF -DMOE_BUILD_TOOLS=OFF -DMOE_BUILD_BENCHMARKS=OFF -DMOE_AREAS="core;layer;schedule;emu" \
        -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DCMAKE_EXPORT_COMPILE_COMMANDS=ON "${cache[@]}"
  cmake --build "$build" -j"$jobs"
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  ctest --test-dir "$build" -L 'host|emu' -E 'headers_compile_alone|consumer_project' --output-on-failure -j"$jobs"
  # The rest of the C++ (planners, s-MoE, tools, examples, benchmarks, MPI programs, the headers
  # together) through clang's front end, -Werror, without making code (about a minute).
  bash scripts/clang_check.sh "$build"
  exit 0
fi

if [ "${1:-}" = "--tsan" ]; then
  build=${MOE_BUILD_DIR:-build-tsan}
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOE_SANITIZE=thread -DMOE_ENABLE_CUDA=OFF -DMOE_REQUIRE_TEST_DEPS=ON \
        -DMOE_AREAS=emu -DMOE_BUILD_EXAMPLES=OFF -DMOE_BUILD_TOOLS=OFF -DMOE_BUILD_BENCHMARKS=OFF -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON "${cache[@]}"
  cmake --build "$build" -j"$jobs"
  export TSAN_OPTIONS=halt_on_error=0:second_deadlock_stack=1
  ctest --test-dir "$build" -L emu_tsan --output-on-failure -j"$jobs"
  exit 0
fi

build=${MOE_BUILD_DIR:-build}
# The library's programs (examples, tools, benchmarks) at -O3; the emulated CUDA tests at -O2, which
# runs their kernels as fast and compiles them in a quarter to a third less time; the host and MPI test
# programs at -O1, which compiles them in 40 % less time (cmake/MoeHelpers.cmake).
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOE_REQUIRE_TEST_DEPS=ON -DMOE_HOST_TEST_OPT=-O1 \
      -DMOE_EMU_TEST_OPT=-O2 "${cache[@]}"
cmake --build "$build" -j"$jobs"
ctest --test-dir "$build" -L 'host|mpi|emu' --output-on-failure -j"$jobs"

# The Python package (python/, docs/engines.md) built from these headers, and its tests
# (tests/python: EPLB against eplb.py's cases, property and bad-input tests, the engine policies).
# Its build folder python/build/ is kept, so a second run rebuilds only what changed. The wheel stays
# in python/build/dist/: scripts/engine_check.sh installs it into the engines' environment (the same
# Python) instead of compiling the package again while it is newer than python/ and include/.
rm -rf python/build/dist
CMAKE_ARGS="${cache[*]}" CMAKE_BUILD_PARALLEL_LEVEL=$jobs \
  python3 -m pip wheel -q --no-deps --no-build-isolation -w python/build/dist ./python
moe_pip_install --no-deps --force-reinstall python/build/dist/moe_compose-*.whl
# moe_compose.device's tests load the device split's library built for the CUDA emulator, when this
# build made one (tests/emu/cuda.cmake; the emulator needs x86-64); without it they are skipped.
emu_lib="$build/tests/emu/libmoe_compose_cuda_emu.so"
case "$emu_lib" in /*) ;; *) emu_lib="$PWD/$emu_lib" ;; esac
if [ -f "$emu_lib" ]; then export MOE_COMPOSE_DEVICE_LIB="$emu_lib"; fi
python3 -m pytest -q -rs tests/python  # -rs: every skipped test with its reason
