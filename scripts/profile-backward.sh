#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device-prepare.sh: Nsight Compute on our tensor-core
# backward's main kernel (D = 128: `flash-attn bench --shapes fixture`, B=1, N=4096, H=32; the
# head dims of `--shapes headdims`: that row, B=4, N=4096, H=(2048+D/2)/D; others refused) and on
# the PyTorch SDPA peers' backward kernels of one call of the same shape
# (scripts/peers/profile_pass.py), the same sections and metrics for both (tensor pipes'
# utilization, warps' stall reasons), the clocks left alone. Writes $OUT/ncu-backward.txt (or
# reports/bench/).
# usage: profile-backward.sh [CAUSAL, default false] [PEERS, default "cudnn"] [D, default 128]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-reports/bench}
mkdir -p "$out"
causal=${1:-false}
peers=${2:-cudnn}
d=${3:-128}
case "$d" in
  128) shapes="fixture"; batch=1; heads=32 ;;
  32|80|96|160|192|256) shapes="headdims --head-dim $d"; batch=4; heads=$(( (2048 + d / 2) / d )) ;;
  # `--shapes anchors --head-dim 64` has six rows, and ncu's launch index cannot pick one.
  *) echo "profile-backward: no one-row shape set at d = $d (128, or a head-dim row: 32 80 96 160 192 256)" >&2; exit 2 ;;
esac
. scripts/ncu-find.sh
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats"
metrics="regex:sm__pipe_.*cycles_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,regex:smsp__inst_executed_op_.*red.*sum,sm__cycles_elapsed.avg.per_second"
log=$out/ncu-backward.txt
: > "$log"
echo "=== ours, d=$d B=$batch H=$heads N=4096 causal=$causal (the 4th main-kernel launch, after warm-up)" >> "$log"
"$ncu" --clock-control none --kernel-name "regex:flash_wgmma_backward_[a-z0-9]*_d[0-9]+_g" --launch-skip 3 --launch-count 1 $sections --metrics "$metrics" \
  .device-run/flash-attn bench --shapes $shapes --pass backward --causal "$causal" --calls 1 --samples 20 --warmup 1 \
  --out "$(mktemp -d)" >> "$log" 2>&1
flag=0; [ "$causal" = true ] && flag=1
for peer in $peers; do
  echo "=== $peer, d=$d causal=$causal (every kernel of one backward call, after warm-up)" >> "$log"
  (cd scripts/peers && "$ncu" --clock-control none --profile-from-start off $sections --metrics "$metrics" \
    python3 profile_pass.py $batch $heads 4096 "$d" "$flag" "$peer" backward) >> "$log" 2>&1
done
grep -E "^===|^  [a-zA-Z_].*\(|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Registers Per|Dynamic Shared|Achieved Occupancy|Block Size|Grid Size|pipe_tensor|pipe_lsu|pipe_uniform|pipe_fma |pipe_alu|pipe_xu|global_red_pred_on_any.sum |stalled_(barrier|long_scoreboard|math_pipe|wait|short_scoreboard|sleeping|dispatch|mio|lg_throttle|membar|branch|no_instruction|selected)" "$log"
