#!/usr/bin/env bash
# Quick start, command 1: builds and runs the end-to-end demo (an OLMoE-1B-7B MoE layer, expert
# parallel on 4 ranks, checked against the single-process reference). Extra arguments go to the
# demo, e.g. `scripts/demo.sh --model deepseek-v3-small`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
moe_install_missing_packages
build=${MOE_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target moe_demo -j"$(moe_jobs)"
"$build/examples/demo/moe_demo" "$@"
