#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang, -fsanitize=fuzzer,address,undefined) and runs
# each from its seed corpus.
#
#   scripts/fuzz.sh                 CI mode: every target for MOE_FUZZ_SECONDS (default 10) seconds
#   scripts/fuzz.sh --runs N        every target for N executions (the long runs of docs/fuzzing.md)
#   scripts/fuzz.sh --only NAME ... one target only (combine with the above)
#
# Corpora grow in build-fuzz/corpus/<target>; a crash leaves build-fuzz/crash-* and stops the script
# with a non-zero status. Each run's last status line is printed (executions, corpus size).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
MOE_DEBIAN_PACKAGES=(clang libclang-rt-dev nlohmann-json3-dev libyaml-cpp-dev libzip-dev)
moe_install_missing_packages

targets=(load_profile olmoe_counts topology plan route_counts token_table sequence_table perf_models cli_numbers
         engine_plan torch_pickle safetensors plan_cli batch_split)
mode=(-max_total_time="${MOE_FUZZ_SECONDS:-10}")
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) mode=(-runs="$2"); shift 2 ;;
    --only) targets=("$2"); shift 2 ;;
    *) echo "fuzz.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

out=${MOE_FUZZ_DIR:-build-fuzz}
mkdir -p "$out/bin" "$out/corpus"
cxx=(${MOE_FUZZ_CXX:-clang++})
moe_use_ccache
cxx=("${MOE_CCACHE[@]}" "${cxx[@]}")   # a fresh clone recompiles nothing that did not change
# -gline-tables-only: a report's stack names files and lines; full debug information made the build
# a third slower.
flags=(-std=c++20 -O1 -gline-tables-only -Iinclude -Itools/include -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
libs=(-lyaml-cpp -lzip)  # engine formats (include/moe/interop/)
# One program holds every target (MOE_FUZZ_TARGET picks one at run time), so the readers are compiled
# once: 13 builds of one target each took 12 to 17 s apiece on the 2-core CI machine, the program
# of all of them about 55 s. The seed maker builds beside it. Compiled and linked apart: ccache
# caches compilations, never a compile-and-link command.
src=tests/fuzz/fuzz_targets.cpp bin="$out/bin/fuzz_targets"
build_seeds() {
  "${cxx[@]}" -std=c++20 -O1 -Iinclude -c tests/fuzz/make_seeds.cpp -o "$out/bin/make_seeds.o" &&
    "${cxx[@]}" "$out/bin/make_seeds.o" -o "$out/bin/make_seeds" "${libs[@]}"
}
build_targets() {
  if [ -x "$bin" ] && [ ! "$src" -nt "$bin" ] && [ -z "$(find include tools/include -newer "$bin" -name '*.hpp' -print -quit)" ]; then
    return 0
  fi
  "${cxx[@]}" "${flags[@]}" -c "$src" -o "$bin.o" >"$out/build.log" 2>&1 &&
    "${cxx[@]}" "${flags[@]}" "$bin.o" -o "$bin" "${libs[@]}" >>"$out/build.log" 2>&1 || {
    cat "$out/build.log" >&2
    echo "fuzz.sh: $bin did not build" >&2
    return 1
  }
}
build_seeds &
seeds=$!
build_targets
wait "$seeds"
"$out/bin/make_seeds" "$out/seeds" tests/data

# One job per target, as many at once as there are cores: each fuzzer has a core of its own, so a
# run's wall time per target is the same as when they ran one after the other.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fuzz_one() {
  local t=$1
  mkdir -p "$out/corpus/$t"
  MOE_FUZZ_TARGET=$t "$bin" "${mode[@]}" -rss_limit_mb=2048 -timeout=10 -max_len=4096 -print_final_stats=1 \
                     -artifact_prefix="$out/crash-$t-" "$out/corpus/$t" "$out/seeds/$t" 2>"$out/$t.log" || {
    tail -40 "$out/$t.log" >&2
    echo "fuzz.sh: fuzz target $t found a problem (see $out/$t.log and $out/crash-$t-*)" >&2
    return 1
  }
}
jobs=$(moe_jobs)
running=()
failed=0
for t in "${targets[@]}"; do
  fuzz_one "$t" &
  running+=($!)
  if [ ${#running[@]} -ge "$jobs" ]; then
    wait "${running[0]}" || failed=1
    running=("${running[@]:1}")
  fi
done
for p in "${running[@]}"; do wait "$p" || failed=1; done
for t in "${targets[@]}"; do
  echo "== $t ${mode[*]}"
  [ -f "$out/$t.log" ] && grep -E "^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::peak_rss_mb)" "$out/$t.log" | tr '\n' ' '
  echo
done
exit $failed
