#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device-prepare.sh: ours and PyTorch SDPA side by side in
# one call, both timed pipelined (many calls back to back between two events, after warm-up),
# the peers in both layouts and twice (their run-to-run spread). Our evidence bundles (every raw
# sample) and the peers' JSON go to $OUT (or reports/bench/), at most five files, since the
# device tool returns eight; the ratio table is printed and saved. Then the memory measurements.
# `decode`: the decode rows of issue 11 (examples/decode_bench.rs) and the PyTorch SDPA peers on
# the same rows (scripts/peers/decode_bench.py), pipelined timing, raw samples in JSON.
# `headdims`: the head-dim table of issue 10 (d = 32, 80, 96, 160, 192, 256 at N = 4096, causal
# and not; `flash-attn bench --shapes headdims`) against the same SDPA peers, its ratio table in
# $out/headdim-table.md.
# `window`: the window cost of issue 10 (`flash-attn bench --shapes window`: N = 16384 full and
# with a window, beside the same rows at 2048 and 1024 keys; ours only, forward and backward).
# `tuning`: the compiled tile variants of each family side by side (examples/tc_bench built with
# `--features tuning`, which `TUNING=1 scripts/device-prepare.sh` packs), ours only, per-launch
# events; its table in $out/tuning-table.md, after gpu_variants (same feature) has checked every
# candidate against the f64 reference (log in $out/tuning-variants.log).
# usage: bench-h200.sh [all|speed|memory|decode|headdims|window|tuning] [flash-attn bench options, e.g. --pass forward]
set -uo pipefail
what=${1:-all}; shift || true
out=${OUT:-reports/bench}
mkdir -p "$out"
# FLASH_ATTN_CLI: another build's CLI to time (ab-session.sh's PEERS=a: the older build's).
fa=${FLASH_ATTN_CLI:-.device-run/flash-attn}
export PYTHONUNBUFFERED=1
if [ "$what" = decode ]; then
  .device-run/decode_bench --out "$out" "$@"
  OUT="$out" python3 scripts/peers/decode_bench.py
  python3 scripts/peers/decode_table.py "$out" | tee "$out/decode-table.md"
  exit
fi
if [ "$what" = headdims ]; then
  $fa bench --kernel auto --shapes headdims --out "$out" "$@"
  OUT="$out" python3 scripts/peers/sdpa_bench.py --backends flash cudnn --shapes headdims
  python3 scripts/peers/ratio_table.py "$out/sdpa.json" "$out"/bench-auto-*.json | tee "$out/headdim-table.md"
  exit
fi
if [ "$what" = tuning ]; then
  .device-run/tuning/gpu_variants --test-threads=1 --nocapture > "$out/tuning-variants.log" 2>&1
  tested=$?
  tail -n 3 "$out/tuning-variants.log"
  .device-run/tuning/tc_bench | tee "$out/tuning-table.md"
  timed=${PIPESTATUS[0]}
  exit $((tested || timed))
fi
if [ "$what" = window ]; then
  $fa bench --kernel auto --shapes window --out "$out" "$@" | tee "$out/window-table.txt"
  exit
fi
if [ "$what" != memory ]; then
  $fa bench --kernel auto --shapes anchors --out "$out" "$@"
  python3 scripts/peers/sdpa_bench.py --backends flash cudnn
  python3 scripts/peers/ratio_table.py "$out/sdpa.json" "$out"/bench-auto-*.json | tee "$out/ratio-table.md"
fi
if [ "$what" != speed ]; then
  $fa memory --kernel auto,exact --out "$out"
  python3 scripts/peers/sdpa_bench.py --memory
fi
