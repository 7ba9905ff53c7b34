#!/usr/bin/env bash
# The README's first command as a newcomer meets it: scripts/demo.sh in a fresh clone of this
# repository's HEAD, with every test-only dependency out of its sight, must build and run the demo.
# CI runs it first (.ci/run); it fails when configuring or building the demo needs anything only the
# tests need.
#
#   scripts/quickstart_check.sh          clone HEAD into a temporary folder and run its demo.sh there
#   scripts/quickstart_check.sh REV      the same for another commit (e.g. one from before a fix, to
#                                        see the check fail)
#
# What is hidden:
#   - the Python test packages (PyYAML, nvidia-cutlass and its CuTe headers, nvidia-cuda-cccl): the
#     demo sees a `python3` that imports no site package (python3 -I -S);
#   - where this process may make a private mount namespace (root, `unshare -m`), the headers and
#     CMake packages of the Debian test packages too (Catch2, Google Benchmark, GLPK, LEMON, METIS):
#     empty files and folders are mounted over them for the demo's processes only. Without that
#     privilege the script says so and hides the Python side only.
# Only committed files are checked: the clone is of HEAD (or REV).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/moe-quickstart.XXXXXX")
trap 'rm -rf "$work"' EXIT

git clone -q "$repo" "$work/clone"
if [ -n "${1:-}" ]; then
  git -C "$work/clone" checkout -q "$1"
fi

# A python3 that cannot import anything installed with pip or apt (site-packages and dist-packages).
real_python=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null || true)
mkdir -p "$work/bin"
if [ -n "$real_python" ]; then
  printf '#!/bin/sh\nexec "%s" -I -S "$@"\n' "$real_python" >"$work/bin/python3"
  chmod +x "$work/bin/python3"
  cp "$work/bin/python3" "$work/bin/python"
  if "$work/bin/python3" -c 'import yaml' 2>/dev/null || "$work/bin/python3" -c 'import cutlass_library' 2>/dev/null; then
    echo "quickstart_check: the stand-in python3 still imports a test package" >&2
    exit 1
  fi
fi

# Debian test packages: paths to cover, when present.
hide=(/usr/include/catch2 /usr/lib/cmake/Catch2 /usr/include/benchmark
      /usr/lib/x86_64-linux-gnu/cmake/benchmark /usr/include/lemon /usr/lib/x86_64-linux-gnu/cmake/lemon
      /usr/include/glpk.h /usr/include/metis.h /usr/include/simgrid)
run_demo='cd "$1/clone" && PATH="$1/bin:$PATH" bash scripts/demo.sh --tokens 48'
mounts=""
for p in "${hide[@]}"; do
  if [ -d "$p" ]; then mounts+="mount -t tmpfs none '$p' && "
  elif [ -e "$p" ]; then mounts+="mount --bind /dev/null '$p' && "
  fi
done

log="$work/demo.log"
if [ "$(id -u)" -eq 0 ] && unshare -m true 2>/dev/null; then
  echo "quickstart_check: demo.sh in a fresh clone, Python test packages and Debian test headers hidden"
  # The demo installs missing Debian build packages itself, so dpkg must not be fooled: only paths
  # are covered, the packages stay installed.
  set +e
  unshare -m sh -c "mount --make-rprivate / && ${mounts} bash -c '$run_demo' _ '$work'" >"$log" 2>&1
  rc=$?
  set -e
else
  echo "quickstart_check: demo.sh in a fresh clone, Python test packages hidden (no mount namespace here:" \
       "Debian test headers stay visible)"
  set +e
  bash -c "$run_demo" _ "$work" >"$log" 2>&1
  rc=$?
  set -e
fi
if [ "$rc" -ne 0 ] || ! grep -q "^OK: expert-parallel output equals the reference" "$log"; then
  tail -40 "$log" >&2
  echo "quickstart_check: FAILED: scripts/demo.sh did not build and run the demo (exit $rc)" >&2
  exit 1
fi
grep -E "^-- moe: left out|^OK:" "$log"
echo "quickstart_check: passed"
