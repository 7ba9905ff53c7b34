#!/usr/bin/env bash
# clang's front end over the C++ that the sanitizer build does not compile: the planners', s-MoE's
# and FinDEP tools, the planner and s-MoE tests, the host examples and benchmarks, the MPI programs,
# and every public .hpp header in one translation unit. `clang++ -fsyntax-only` parses, checks and
# instantiates templates as a compile does, but makes no code, so the whole pass takes about a minute
# on two cores (55-63 s, 115 CPU-s) where building those programs with clang would take several. It catches
# what clang rejects and g++ accepts (e.g. clang 14 before 16 rejects a lambda that captures a
# structured binding) and every clang warning of -Wall -Wextra, as errors.
#
#   scripts/clang_check.sh SANITIZE_BUILD   sources that SANITIZE_BUILD/compile_commands.json lacks
#                                           (scripts/test.sh --sanitize runs it after its build)
#
# The compile commands come from a configure-only build folder, build-clang-check/ (clang++,
# every area, no CUDA: the .cu files need nvcc, and the emulated tests are in the sanitizer build).
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize_build=${1:?usage: scripts/clang_check.sh SANITIZE_BUILD (a build folder with compile_commands.json)}
[ -f "$sanitize_build/compile_commands.json" ] || {
  echo "clang_check: $sanitize_build/compile_commands.json not found (configure it with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON)" >&2
  exit 2
}
build=${MOE_CLANG_CHECK_DIR:-build-clang-check}
mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DMOE_ENABLE_CUDA=OFF \
      -DMOE_EMULATOR=OFF -DMOE_REQUIRE_TEST_DEPS=ON -DCMAKE_BUILD_TYPE=Release >"$build/configure.log" 2>&1 || {
  cat "$build/configure.log" >&2
  exit 1
}

# One translation unit of every public .hpp header (each alone is the plain build's check); the NCCL
# collectives only where the CUDA toolkit's headers and nccl.h are.
headers=$build/all_headers.cpp
cuda_include=${CUDA_HOME:-/usr/local/cuda}/include
skip='^$'
if [ ! -f "$cuda_include/nccl.h" ] || [ ! -f "$cuda_include/cuda_runtime.h" ]; then
  skip=nccl
  echo "clang_check: no nccl.h and cuda_runtime.h in $cuda_include: the NCCL headers are left out"
fi
(cd include && find moe -name '*.hpp' | grep -v "$skip" | LC_ALL=C sort | sed 's/.*/#include "&"/') >"$headers"

# The commands: each C++ source of $build that the sanitizer build does not compile, with -o dropped
# and -fsyntax-only -Werror added; the headers' unit with the flags of an MPI program (MPI's include
# path; the NCCL headers need the CUDA toolkit's).
python3 - "$build/compile_commands.json" "$sanitize_build/compile_commands.json" "$headers" "$cuda_include" >"$build/commands.txt" <<'EOF'
import json, os, shlex, sys

check, done, headers, cuda_include = sys.argv[1:5]


def key(file, database):
    """A source's identity across the two builds: a file generated in a build folder (a test group's
    unit, e.g. tests/layer/gen/layer_tests_0.cpp) by its path in that folder, any other by its path."""
    f, build = os.path.realpath(file), os.path.realpath(os.path.dirname(database))
    return "build:" + os.path.relpath(f, build) if f.startswith(build + os.sep) else f


compiled = {key(c["file"], done) for c in json.load(open(done))}
commands, mpi_flags = [], None
for c in json.load(open(check)):
    f = os.path.realpath(c["file"])
    if not f.endswith(".cpp") or key(f, check) in compiled or "/tests/headers/" in f:
        continue
    args = shlex.split(c["command"]) if "command" in c else c["arguments"]
    kept, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        else:
            kept.append(a)
    kept[1:1] = ["-fsyntax-only", "-Werror"]
    if mpi_flags is None and any("mpi" in a for a in kept if a.startswith(("-I", "-isystem", "/"))):
        mpi_flags = []  # the include paths of an MPI program, which name MPI's
        for i, a in enumerate(kept):
            if a in ("-I", "-isystem") and i + 1 < len(kept):
                mpi_flags += [a, kept[i + 1]]
            elif a.startswith(("-I", "-isystem")) and a not in ("-I", "-isystem"):
                mpi_flags.append(a)
    commands.append((c["directory"], kept))
flags = (mpi_flags or []) + ["-isystem", cuda_include]
root = os.getcwd()
commands.append((root, ["clang++", "-fsyntax-only", "-Werror", "-Wall", "-Wextra", "-std=c++20", "-I" + root + "/include"]
                 + flags + [os.path.realpath(headers)]))
for d, a in commands:
    print("cd %s && %s" % (shlex.quote(d), " ".join(shlex.quote(x) for x in a)))
EOF
n=$(wc -l <"$build/commands.txt")
s=$(date +%s)
# One line per command; a failing one prints its diagnostics, and the pass goes on to report them all.
failed=0
xargs -d '\n' -P "$(nproc 2>/dev/null || echo 2)" -I{} bash -c 'eval "$1" || { echo "clang_check: FAILED: $1" >&2; exit 1; }' _ {} \
  <"$build/commands.txt" || failed=1
if [ "$failed" != 0 ]; then
  echo "clang_check: clang rejected some of the $n units above" >&2
  exit 1
fi
echo "clang_check: ok, $n units parsed and checked by $(clang++ --version | head -1) in $(( $(date +%s) - s )) s"
