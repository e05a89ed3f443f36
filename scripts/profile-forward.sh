#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device-prepare.sh: Nsight Compute on our tensor-core
# forward and on the PyTorch SDPA peers' forward kernels of one call of the same shape
# (scripts/peers/profile_pass.py), the same sections and metrics for both (launch configuration,
# occupancy, tensor pipes' utilization, warps' stall reasons), the clocks left alone. The shape
# is the first d = 128 anchors row, B=32 H=16 N=512 (`flash-attn bench --shapes anchors
# --head-dim 128 --causal C` starts with it, so ncu's 4th launch is that row's), where the
# forward is furthest behind cuDNN's; or the fixture (B=1 H=32 N=4096) with SHAPE=fixture.
# Writes $OUT/ncu-forward.txt (or reports/bench/).
# usage: [SHAPE=short|fixture] profile-forward.sh [CAUSAL, default true] [PEERS, default "cudnn"]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-reports/bench}
mkdir -p "$out"
causal=${1:-true}
peers=${2:-cudnn}
case "${SHAPE:-short}" in
  short) shapes="anchors --head-dim 128"; batch=32; heads=16; n=512 ;;
  fixture) shapes="fixture"; batch=1; heads=32; n=4096 ;;
  *) echo "profile-forward: SHAPE is short or fixture, not ${SHAPE}" >&2; exit 2 ;;
esac
. scripts/ncu-find.sh
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats"
metrics="regex:sm__pipe_.*cycles_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,sm__cycles_elapsed.avg.per_second"
log=$out/ncu-forward.txt
: > "$log"
echo "=== ours, d=128 B=$batch H=$heads N=$n causal=$causal (the 4th launch, after warm-up)" >> "$log"
"$ncu" --clock-control none --kernel-name "regex:flash_wgmma_forward_" --launch-skip 3 --launch-count 1 $sections --metrics "$metrics" \
  .device-run/flash-attn bench --shapes $shapes --pass forward --causal "$causal" --calls 1 --samples 20 --warmup 1 \
  --out "$(mktemp -d)" >> "$log" 2>&1
flag=0; [ "$causal" = true ] && flag=1
for peer in $peers; do
  echo "=== $peer, d=128 B=$batch H=$heads N=$n causal=$causal (every kernel of one forward call, after warm-up)" >> "$log"
  (cd scripts/peers && "$ncu" --clock-control none --profile-from-start off $sections --metrics "$metrics" \
    python3 profile_pass.py $batch $heads $n 128 "$flag" "$peer" forward) >> "$log" 2>&1
done
grep -E "^===|^  [a-zA-Z_].*\(|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Registers Per|Dynamic Shared|Static Shared|Achieved Occupancy|Theoretical Occupancy|Block Size|Grid Size|Waves Per SM|pipe_tensor|pipe_fma |pipe_alu|pipe_xu|stalled_(barrier|long_scoreboard|math_pipe|wait|short_scoreboard|sleeping|dispatch|mio|lg_throttle|membar|branch|no_instruction|selected)" "$log"
