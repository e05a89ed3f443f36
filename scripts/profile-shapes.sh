#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device-prepare.sh: Nsight Compute on one launch of our
# kernel for each shape given (examples/decode_bench.rs --shapes, d = 128, no mask, the plan's
# kernel), with the tensor pipes' utilization and the warps' stall reasons beside the usual
# sections, the clocks left alone. To tell why one shape runs slower than another of the same
# kernel. Writes $OUT/ncu-shapes.txt (or reports/bench/).
# usage: profile-shapes.sh "B,Nq,Nk,Hq,Hkv B,Nq,Nk,Hq,Hkv ..." [KERNEL_REGEX, default flash_]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-reports/bench}
mkdir -p "$out"
shapes=${1:?"usage: profile-shapes.sh \"B,Nq,Nk,Hq,Hkv ...\" [KERNEL_REGEX]"}
kernel=${2:-flash_}
. scripts/ncu-find.sh
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section WarpStateStats --section SchedulerStats"
metrics="regex:sm__pipe_.*cycles_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,sm__cycles_elapsed.avg.per_second"
log=$out/ncu-shapes.txt
: > "$log"
for shape in $shapes; do
  echo "=== ours, shape $shape (the 4th launch, after warm-up)" >> "$log"
  "$ncu" --clock-control none --kernel-name "regex:$kernel" --launch-skip 3 --launch-count 1 $sections --metrics "$metrics" \
    .device-run/decode_bench --shapes "$shape" --no-caches --combine last-split --calls 1 --samples 20 --warmup 1 \
    --out "$(mktemp -d)" >> "$log" 2>&1
done
grep -E "^===|^  [a-z_]+.*\(|Duration|SM Frequency|Compute \(SM\) Throughput|Issue Slots Busy|pipe_tensor|stalled_(barrier|long_scoreboard|math_pipe|wait|short_scoreboard|sleeping|dispatch|mio|lg_throttle|membar|branch|no_instruction|selected)" "$log"
