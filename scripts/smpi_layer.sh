#!/usr/bin/env bash
# moe::Layer<..., collective::Mpi> on a simulated cluster: builds tools/smpi/smpi_layer.cpp with
# SimGrid's smpicxx and runs it with smpirun (Debian libsimgrid-dev ships both; docs/results/simgrid.md).
#
#   scripts/smpi_layer.sh [RANKS] [TOKENS_PER_RANK] [OUT_DIR]     defaults: 64 16 build-smpi
#
# The platform: RANKS hosts, one 400 Gb/s NIC each (50 GB/s, 2 us) on a non-blocking switch
# (RANKS x 50 GB/s, 1 us). Computation is not simulated: the times are the layer's communication.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ranks=${1:-64}
tokens=${2:-16}
out=${3:-$root/build-smpi}
for tool in smpicxx smpirun; do
  command -v "$tool" >/dev/null || { echo "smpi_layer.sh: $tool not found (apt-get install libsimgrid-dev)" >&2; exit 2; }
done
[[ "$ranks" =~ ^[1-9][0-9]*$ ]] || { echo "smpi_layer.sh: RANKS must be a positive integer, got '$ranks'" >&2; exit 2; }
mkdir -p "$out"
src="$root/tools/smpi/smpi_layer.cpp"
bin="$out/smpi_layer"
if [ ! -x "$bin" ] || [ -n "$(find "$root/include" "$src" "$root/tools/include" -newer "$bin" -name '*.?pp' -print -quit)" ]; then
  smpicxx -std=c++20 -O1 -I"$root/include" -I"$root/tools/include" "$src" -o "$bin"
fi
platform="$out/cluster-$ranks.xml"
hosts="$out/hosts-$ranks"
cat > "$platform" <<XML
<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<platform version="4.1">
  <cluster id="flat" prefix="rank-" suffix="" radical="0-$((ranks - 1))" speed="1Gf"
           bw="50GBps" lat="2us" bb_bw="$((ranks * 50))GBps" bb_lat="1us"/>
</platform>
XML
seq -f "rank-%g" 0 $((ranks - 1)) > "$hosts"
smpirun -quiet -np "$ranks" -platform "$platform" -hostfile "$hosts" \
        --cfg=smpi/simulate-computation:no --log=root.thresh:warning "$bin" "$tokens"
