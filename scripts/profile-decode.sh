#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device-prepare.sh: Nsight Compute on one decode launch of
# ours (examples/decode_bench.rs) and on the PyTorch SDPA peers' kernels of one call
# (scripts/peers/profile_decode.py) for each decode row given, the same sections for both, the
# clocks left alone. Writes $OUT/ncu-decode.txt (or reports/bench/).
# usage: profile-decode.sh [ROWS, default "1 2"] [PEERS, default "cudnn"]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-reports/bench}
mkdir -p "$out"
rows=${1:-1 2}
peers=${2:-cudnn}
. scripts/ncu-find.sh
sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats"
log=$out/ncu-decode.txt
: > "$log"
for row in $rows; do
  echo "=== ours, row $row (the plan's split count, last-split merge; the 4th launch, after warm-up)" >> "$log"
  "$ncu" --clock-control none --kernel-name regex:flash_decode_mma --launch-skip 3 --launch-count 1 $sections \
    .device-run/decode_bench --rows "$row" --no-caches --combine last-split --calls 1 --samples 20 --warmup 1 \
    --out "$(mktemp -d)" >> "$log" 2>&1
  for peer in $peers; do
    echo "=== $peer, row $row (every kernel of one call, after warm-up)" >> "$log"
    (cd scripts/peers && "$ncu" --clock-control none --profile-from-start off $sections \
      python3 profile_decode.py "$row" "$peer") >> "$log" 2>&1
  done
done
grep -E "^===|^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Registers Per|Grid Size|Block Size|Achieved Occupancy|Dynamic Shared|Waves Per SM|L2 Hit|Mem Busy|Max Bandwidth" "$log"
