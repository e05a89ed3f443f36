#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device-prepare.sh: Nsight Compute on the FP8 (e4m3)
# forward and on the bf16 d = 128 forward it is compared with, each the 4th launch of
# `gpu_fp8`'s `fp8_forward_speed_beside_bf16` (B=1, H=32, N=4096, not causal, after warm-up), the
# same sections and metrics for both (tensor pipes, the exponentials' XU pipe, warps' stall
# reasons), the clocks left alone. Writes $OUT/ncu-fp8.txt (or reports/bench/) and prints its
# summary lines.
# usage: profile-fp8.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-reports/bench}
mkdir -p "$out"
. scripts/ncu-find.sh
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats"
metrics="regex:sm__pipe_.*cycles_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,sm__cycles_elapsed.avg.per_second"
log=$out/ncu-fp8.txt
: > "$log"
for kernel in flash_wgmma_forward_e4m3_d128 flash_wgmma_forward_bf16_d128; do
  echo "=== $kernel, B=1 H=32 N=4096 causal=false (the 4th launch)" >> "$log"
  "$ncu" --clock-control none --kernel-name "regex:$kernel" --launch-skip 3 --launch-count 1 $sections --metrics "$metrics" \
    .device-run/tests/gpu_fp8 fp8_forward_speed --test-threads=1 >> "$log" 2>&1
done
grep -E "^===|^  [a-zA-Z_].*\(|Duration|SM Frequency|Compute \(SM\) Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy|Eligible Warps|pipe_(tensor|alu|fma|fmaheavy|xu|shared|lsu|uniform)_cycles|stalled_(barrier|long_scoreboard|math_pipe_throttle|wait|short_scoreboard|mio_throttle|selected|lg_throttle|dispatch_stall|no_instruction|sleeping)_per" "$log"
