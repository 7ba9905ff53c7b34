#!/usr/bin/env bash
# Quick start, command 1: builds and runs the end-to-end demo (an OLMoE-1B-7B MoE layer, expert
# parallel on 4 ranks, checked against the single-process reference). Extra arguments go to the
# demo, e.g. `scripts/demo.sh --model deepseek-v3-small`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
# Only what the library and the demo need: test-only dependencies are never required to configure
# (the configuration names, in one line, the checks it leaves out for want of them).
MOE_DEBIAN_PACKAGES=("${MOE_BUILD_PACKAGES[@]}")
moe_install_missing_packages
build=${MOE_BUILD_DIR:-build}
log=$(cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOE_REQUIRE_TEST_DEPS=OFF 2>&1) || {
  echo "$log" >&2
  exit 1
}
grep -E "^-- moe: left out" <<<"$log" || true
cmake --build "$build" --target moe_demo -j"$(moe_jobs)"
"$build/examples/demo/moe_demo" "$@"
