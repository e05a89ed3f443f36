#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device-prepare.sh: Nsight Compute on our tensor-core main
# kernel of PASS (forward or backward) and on the PyTorch SDPA peers' kernels of one call of the
# same shape (scripts/peers/profile_pass.py), the same sections and metrics for both (launch
# configuration, occupancy, tensor pipes' utilization, warps' stall reasons, reductions), the
# clocks left alone. Writes $OUT/ncu-PASS.txt (or reports/bench/).
# SHAPE, one row of `flash-attn bench` (ncu's 4th launch of the kernel is that row's):
#   128 (default)             the fixture, B=1 N=4096 H=32, d = 128
#   32 80 96 160 192 256      that row of `--shapes headdims`, B=4 N=4096 H=(2048+D/2)/D
#   short                     the first d = 128 anchors row, B=32 H=16 N=512 (`--shapes anchors
#                             --head-dim 128 --causal C` starts with it), where the forward is
#                             furthest behind cuDNN
# `--shapes anchors --head-dim 64` has six rows, and ncu's launch index cannot pick one: no d = 64.
# FLASH_ATTN_CLI: another build's CLI to profile (default .device-run/flash-attn, the packed build).
# usage: profile-pass.sh PASS [CAUSAL, default false] [PEERS, default "cudnn"] [SHAPE, default 128]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-reports/bench}
mkdir -p "$out"
pass=${1:?"usage: profile-pass.sh PASS [CAUSAL] [PEERS] [SHAPE]"}
causal=${2:-false}
peers=${3:-cudnn}
shape=${4:-128}
case "$pass" in
  forward) kernel="flash_wgmma_forward_" ;;
  # The main kernel, not the preprocessing and conversion kernels around it.
  backward) kernel="flash_wgmma_backward_[a-z0-9]*_d[0-9]+_g" ;;
  *) echo "profile-pass: PASS is forward or backward, not $pass" >&2; exit 2 ;;
esac
case "$shape" in
  128) shapes="fixture"; batch=1; heads=32; n=4096; d=128 ;;
  32|80|96|160|192|256) d=$shape; shapes="headdims --head-dim $d"; batch=4; heads=$(( (2048 + d / 2) / d )); n=4096 ;;
  short) shapes="anchors --head-dim 128"; batch=32; heads=16; n=512; d=128 ;;
  *) echo "profile-pass: no one-row shape set '$shape' (128, short, or a head-dim row: 32 80 96 160 192 256)" >&2; exit 2 ;;
esac
. scripts/ncu-find.sh
fa=${FLASH_ATTN_CLI:-.device-run/flash-attn}
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats"
metrics="regex:sm__pipe_.*cycles_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,regex:smsp__inst_executed_op_.*red.*sum,sm__cycles_elapsed.avg.per_second,smsp__inst_executed.sum"
log=$out/ncu-$pass.txt
: > "$log"
echo "=== ours, $pass d=$d B=$batch H=$heads N=$n causal=$causal (the 4th main-kernel launch, after warm-up; $fa)" >> "$log"
"$ncu" --clock-control none --kernel-name "regex:$kernel" --launch-skip 3 --launch-count 1 $sections --metrics "$metrics" \
  "$fa" bench --shapes $shapes --pass "$pass" --causal "$causal" --calls 1 --samples 20 --warmup 1 \
  --out "$(mktemp -d)" >> "$log" 2>&1
flag=0; [ "$causal" = true ] && flag=1
for peer in $peers; do
  echo "=== $peer, $pass d=$d B=$batch H=$heads N=$n causal=$causal (every kernel of one $pass call, after warm-up)" >> "$log"
  (cd scripts/peers && "$ncu" --clock-control none --profile-from-start off $sections --metrics "$metrics" \
    python3 profile_pass.py $batch $heads $n "$d" "$flag" "$peer" "$pass") >> "$log" 2>&1
done
grep -E "^===|^  [a-zA-Z_].*\(|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Registers Per|Dynamic Shared|Static Shared|Achieved Occupancy|Theoretical Occupancy|Block Size|Grid Size|Waves Per SM|pipe_tensor|pipe_lsu|pipe_uniform|pipe_fma |pipe_alu|pipe_xu|inst_executed.sum |global_red_pred_on_any.sum |stalled_(barrier|long_scoreboard|math_pipe|wait|short_scoreboard|sleeping|dispatch|mio|lg_throttle|membar|branch|no_instruction|selected)" "$log"
