#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device-prepare.sh, with the older build's CLI packed beside
# it as .device-pack/flash-attn-a.xz (`xz -c` of a stripped `flash-attn` built from the commit
# before the change): one device call that times a kernel change against that build and against
# the PyTorch SDPA peers.
#   1. every CLI loads its PTX once, beside the others (each pays the driver's sm_90a JIT, ~100 s)
#   2. TESTS (none by default): these test binaries of the new build
#   3. scripts/ab-bench.sh, ROUNDS alternated rounds, for each SHAPES set (`flash-attn bench
#      --shapes` values, each optionally followed by bench options after a colon, `=` for the
#      space within one and `+` between them, e.g. "fixture headdims:--pass=backward
#      fixture:--pass=forward+--key-lengths"); with STACK="c …" (CLIs packed as
#      .device-pack/flash-attn-c.xz, …, each built from a stack of changes between A and the new
#      build), each build against the one before it: A → c → … → B
#      (ab-<shapes>[-<set number>]-<older>-<newer>)
#   4. PEERS=1 (default): `bench-h200.sh headdims` with the new build (PEERS=a: with A's CLI, the
#      table of the build already on main)
#   5. FP8=1 (the default when TESTS has gpu_fp8): gpu_fp8's speed test of B, alternated ROUNDS
#      times with A's where .device-pack/gpu_fp8-a.xz holds A's `gpu_fp8` test binary
# $OUT gets summary.txt (with every A/B table), the head-dim table and logs.tgz (every bundle and
# log, each A/B table as ab-<pair>/ab-table.md): three files, since the device tool returns eight.
# The summary is written there as it is made, so a call cut off by its time limit still returns
# what it finished; a failed test's log tail goes into it.
# BUDGET (seconds, none by default): what the whole call may take. Each step's time limit is cut
# to what is left of it less 20 s, and a step with under 30 s left is skipped (noted in the
# summary), so that logs.tgz with every raw sample is still written when the device's limit
# would otherwise cut the call off.
# usage: [ROUNDS=2] [SHAPES="fixture headdims"] [TESTS=...] [STACK=...] [PEERS=1|a|0] [FP8=0|1] [BUDGET=...] ab-session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
dest=${OUT:-reports/device}
mkdir -p "$dest"
logs=$(mktemp -d)
summary=$dest/summary.txt
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
deadline=$(( $(date +%s) + ${BUDGET:-1000000} ))
# The time limit of a step that may take up to $1 seconds, within BUDGET (0: skip it).
limit() {
  local left=$(( deadline - $(date +%s) - 20 ))
  if [ $left -lt 30 ]; then echo 0; elif [ $left -lt "$1" ]; then echo $left; else echo "$1"; fi
}
# Runs "$@" under limit $1 (the rest of the arguments: the command), or notes that BUDGET left
# no time for step $2.
run_within() {
  local t; t=$(limit "$1"); shift
  local what=$1; shift
  if [ "$t" = 0 ]; then note "skipped (BUDGET): $what"; return 124; fi
  timeout "$t" "$@"
}
# A binary packed as .device-pack/<name>.xz, made runnable as $logs/<name>.
unpack_bin() { xz -dc ".device-pack/$1.xz" > "$logs/$1" && chmod +x "$logs/$1"; }
export CUDA_CACHE_MAXSIZE=4294967296
scripts/device-unpack.sh --if-needed > "$logs/unpack.log" 2>&1
names=(a ${STACK:-} b) bins=()
for side in a ${STACK:-}; do
  unpack_bin "flash-attn-$side"
  bins+=("$logs/flash-attn-$side")
done
bins+=(.device-run/flash-attn)
note "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); B built from $(cat .device-run/COMMIT)"

for i in "${!bins[@]}"; do
  run_within 250 "warm-up ${names[$i]}" "${bins[$i]}" bench --shapes fixture --pass forward --samples 20 \
    --out "$logs/warm-${names[$i]}" > "$logs/warm-${names[$i]}.log" 2>&1 &
done
wait
note "warm-up: $(date -u +%T)"
for t in ${TESTS:-}; do
  run_within 200 "test $t" ".device-run/tests/$t" --test-threads=1 > "$logs/test-$t.log" 2>&1
  rc=$?
  note "test $t: exit $rc, $(grep -a 'test result' "$logs/test-$t.log" | tail -1)"
  [ $rc = 0 ] || tail -30 "$logs/test-$t.log" >> "$summary"
done

k=0
for set in ${SHAPES:-fixture headdims}; do
  shapes=${set%%:*} opts=""
  [ "$set" != "$shapes" ] && opts=${set#*:}
  # Sets after the first carry their number, so that two sets of one `--shapes` value (other
  # options) keep their bundles apart: ab-bench.sh's table reads every bundle of its folder.
  k=$((k + 1)) tag=$shapes
  [ $k -gt 1 ] && tag=$shapes-$k
  for i in $(seq 1 $((${#bins[@]} - 1))); do
    pair=$tag; [ ${#bins[@]} -gt 2 ] && pair=$tag-${names[$((i - 1))]}-${names[$i]}
    mkdir -p "$logs/ab-$pair"
    OUT=$logs/ab-$pair run_within 300 "ab $pair" scripts/ab-bench.sh "${bins[$((i - 1))]}" "${bins[$i]}" "${ROUNDS:-2}" \
      --shapes "$shapes" $(echo "$opts" | tr '=+' '  ') > "$logs/ab-$pair.log" 2>&1
    note "ab $pair ($opts): exit $?"
    cat "$logs/ab-$pair/ab-table.md" >> "$summary" 2> /dev/null
  done
done
if [ "${PEERS:-1}" != 0 ]; then
  cli=.device-run/flash-attn
  [ "${PEERS:-1}" = a ] && cli=${bins[0]}
  OUT=$logs/bench-headdims FLASH_ATTN_CLI=$cli run_within 280 "bench headdims" scripts/bench-h200.sh headdims > "$logs/bench-headdims.log" 2>&1
  note "bench headdims ($cli): exit $?"
  cp "$logs/bench-headdims/headdim-table.md" "$dest/" 2> /dev/null
fi
fp8=0
[[ " ${TESTS:-} " == *" gpu_fp8 "* ]] && fp8=1
if [ "${FP8:-$fp8}" = 1 ]; then
  sides=(b) fp8_bins=(.device-run/tests/gpu_fp8)
  if [ -e .device-pack/gpu_fp8-a.xz ]; then
    unpack_bin gpu_fp8-a
    sides=(a b) fp8_bins=("$logs/gpu_fp8-a" .device-run/tests/gpu_fp8)
  fi
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for i in "${!sides[@]}"; do
      log=$logs/fp8-speed-${sides[$i]}-$r.log
      run_within 150 "gpu_fp8 speed ${sides[$i]} $r" "${fp8_bins[$i]}" fp8_forward_speed --test-threads=1 --nocapture > "$log" 2>&1
      note "gpu_fp8 speed, ${sides[$i]} round $r: exit $?"
      grep -a "N = " "$log" >> "$summary"
    done
  done
fi
tar czf "$dest/logs.tgz" -C "$logs" --exclude 'flash-attn-*' --exclude 'gpu_fp8-a' .
