#!/usr/bin/env bash
# Brings Catch2 v2 and Google Benchmark along in the tree, for a GPU machine that lacks them and has
# no network. Run it on a Debian 12 (amd64) machine with apt: it downloads the Debian packages into
# .gpu-deps/ at the repository root (git-ignored; copy the tree with that folder to the GPU machine).
# scripts/gpu_bench.sh unpacks every .deb found there into <build>/deps (never into /) and points
# CMake at it. Nothing is installed here: `apt-get download` only fetches the .deb files.
#
#   scripts/gpu_deps.sh            # fetch what is missing
#   scripts/gpu_deps.sh --force    # fetch again
#
# Packages (Debian 12 versions, x86-64):
#   catch2               Catch2 v2 headers + CMake config (the test suite: find_package(Catch2 2))
#   libbenchmark-dev     Google Benchmark headers + CMake config (find_package(benchmark CONFIG))
#   libbenchmark1debian  libbenchmark.so.1debian, the shared library the -dev package links against
#                        (Debian ships no static libbenchmark.a); it needs glibc >= 2.32 and the
#                        libstdc++ of g++ 12 or newer on the GPU machine
# Also copied: nccl.h of this machine's CUDA toolkit into .gpu-deps/nccl-include/, used on the GPU
# machine only when the NCCL of the PyTorch wheel (nvidia-nccl-cu13) comes without its header.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/.gpu-deps
packages=(catch2 libbenchmark-dev libbenchmark1debian)

if [[ "$(dpkg --print-architecture 2>/dev/null)" != "amd64" ]]; then
  echo "gpu_deps.sh: this machine is not amd64; for an x86-64 GPU machine fetch with -oAPT::Architecture=amd64" >&2
  exit 1
fi
mkdir -p "$dest"
if [[ "${1:-}" == "--force" ]]; then
  for p in "${packages[@]}"; do
    find "$dest" -maxdepth 1 -name "${p}_*.deb" -delete
  done
fi

missing=()
for p in "${packages[@]}"; do
  compgen -G "$dest/${p}_*.deb" >/dev/null || missing+=("$p")
done
if ((${#missing[@]})); then
  # apt-get download writes into the current directory; the version is the candidate of this
  # machine's apt lists (Debian 12: catch2 2.13.10-1, libbenchmark 1.7.1-1).
  (cd "$dest" && apt-get download "${missing[@]}") || {
    echo "gpu_deps.sh: apt-get download failed (try 'apt-get update' first)" >&2
    exit 1
  }
fi

# Fallback header for NCCL (the library itself comes from the GPU machine).
nccl_h=""
for d in "${CUDA_HOME:-/usr/local/cuda}/include" /usr/local/cuda-13.0/include /usr/local/include /usr/include; do
  if [[ -f "$d/nccl.h" ]]; then nccl_h=$d/nccl.h; break; fi
done
if [[ -n "$nccl_h" ]]; then
  mkdir -p "$dest/nccl-include"
  cp "$nccl_h" "$dest/nccl-include/nccl.h"
fi

echo "gpu_deps.sh: $dest holds:"
(cd "$dest" && ls -l -- *.deb nccl-include 2>/dev/null)
du -sh "$dest"
