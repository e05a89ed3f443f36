#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device-prepare.sh: Nsight Compute's source counters (warp
# stall samples per SASS instruction) on one launch of a kernel, for finding which instructions
# a step waits on. Writes $OUT/<name>.sass.csv.gz (every SASS line with its samples and stall
# reasons, `--page source --print-source sass`) and $OUT/<name>.ncu.txt (the sections), the
# clocks left alone.
# usage: profile-source.sh NAME KERNEL_REGEX SKIP -- COMMAND...
#   e.g. profile-source.sh fp8 flash_wgmma_forward_e4m3_d128 3 -- .device-run/tests/gpu_fp8 fp8_forward_speed
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 5 ] && [ "$4" = "--" ] || { echo "usage: $0 NAME KERNEL_REGEX SKIP -- COMMAND..." >&2; exit 2; }
name=$1; kernel=$2; skip=$3; shift 4
out=${OUT:-reports/bench}
mkdir -p "$out"
. scripts/ncu-find.sh
rep=$(mktemp -d)/$name
"$ncu" --clock-control none --kernel-name "regex:$kernel" --launch-skip "$skip" --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight --import-source no \
  -o "$rep" "$@" > "$out/$name.ncu.txt" 2>&1
"$ncu" --import "$rep.ncu-rep" --print-summary none >> "$out/$name.ncu.txt" 2>&1
"$ncu" --import "$rep.ncu-rep" --page source --print-source sass --csv 2>> "$out/$name.ncu.txt" | gzip -9 > "$out/$name.sass.csv.gz"
echo "$name: $(zcat "$out/$name.sass.csv.gz" | wc -l) SASS lines"
