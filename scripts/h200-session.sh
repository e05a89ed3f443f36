#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device-prepare.sh (carry .device-pack): one device call
# that checks and times a kernel change, within the device tool's ten minutes and eight returned
# files. First the correctness runs, with `sm90` compute-sanitizer runs beside them (both only
# need the GPU to be right, not idle); then, only if every test passed, the timings alone.
#   1. unpack; `ptx_entries` once (every module's entries load). It no longer fills the driver's
#      JIT cache for the library's own loads: the first test binary after it spends ~90–120 s
#      compiling the sm_90a module (run fold-scale: 96 s, 126 s), so its limit allows for that
#   2. TESTS (default below) one after another, each under a 240 s limit, while memcheck and
#      racecheck run `gpu_matrix` and memcheck `gpu_non_finite` with FLASH_ATTN_FAMILIES=sm90
#      and sequences up to 333; a failing test's FAIL lines and input seeds go to the summary
#   3. BENCHES (default "speed headdims") through scripts/bench-h200.sh, one at a time
# $OUT gets summary.txt, logs.tgz (every log, and each bench's raw JSON and table under
# bench-<name>/) and the benches' tables: five files or fewer. The summary is written there as
# it is made, so a call cut off by the device tool's limit still returns what it finished.
# With the defaults it took about 550 s of the ten minutes (run e607c8d, the same steps inline).
# SANITIZE replaces step 2's sanitizer runs: groups of TOOL:SECONDS:TEST[:NAME_FILTER] joined by
# commas (one after another), the groups separated by spaces (beside each other).
# usage: [TESTS="gpu_variants gpu_matrix ..."] [BENCHES="speed headdims decode"] [SANITIZE=...] h200-session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
dest=${OUT:-reports/device}
mkdir -p "$dest"
logs=$(mktemp -d)
summary=$dest/summary.txt
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
scripts/device-unpack.sh --if-needed > "$logs/unpack.log" 2>&1
note "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); built from $(cat .device-run/COMMIT)"

timeout 200 .device-run/tests/ptx_entries --test-threads=1 > "$logs/ptx_entries.log" 2>&1
note "ptx_entries: exit $?, $(grep -a 'test result' "$logs/ptx_entries.log" | tail -1)"

# One sanitizer run, TOOL:SECONDS:TEST[:NAME_FILTER].
sanitize() {
  local tool limit test filter
  IFS=: read -r tool limit test filter <<< "$1"
  OUT=$logs/$tool-$test scripts/device-sanitize.sh "$tool" "$limit" "$test" FLASH_ATTN_FAMILIES=sm90 \
    FLASH_ATTN_MATRIX_MAX_LEN=333 -- ${filter:+"$filter"} --nocapture > /dev/null 2>&1
}
# SANITIZE: groups separated by spaces run beside each other, the runs of a group (joined by
# commas) one after another.
for group in ${SANITIZE:-memcheck:200:gpu_matrix,memcheck:100:gpu_non_finite racecheck:250:gpu_matrix}; do
  (IFS=,; for run in $group; do sanitize "$run"; done) &
done

passed=1
for t in ${TESTS:-gpu_variants gpu_matrix gpu_non_finite gpu_stream_api gpu_many_heads}; do
  log=$logs/test-$t.log
  timeout 240 ".device-run/tests/$t" --test-threads=1 --show-output > "$log" 2>&1
  rc=$?
  note "test $t: exit $rc, $(grep -a 'test result' "$log" | tail -1)"
  if [ $rc != 0 ]; then
    passed=0
    grep -a "^FAIL \|input seed\|panicked" "$log" | head -40 | tee -a "$summary"
  fi
done
wait
# No sanitizer runs (SANITIZE=" "): no logs, nothing to check.
shopt -s nullglob
for log in "$logs"/*check-*/sanitizer-*.log; do
  note "$(basename "$log" .log): $(grep -a -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1); $(grep -a -c '^ok ' "$log") cases ok; $(tail -1 "$log")"
  [ "$(grep -a -c 'exit status 0 ' "$log")" = 1 ] || passed=0
done

if [ $passed = 1 ]; then
  for b in ${BENCHES:-speed headdims}; do
    OUT=$logs/bench-$b timeout 280 scripts/bench-h200.sh "$b" > "$logs/bench-$b.log" 2>&1
    note "bench $b: exit $?"
    for table in "$logs/bench-$b"/*table.md; do
      [ -f "$table" ] && cp "$table" "$dest/" && grep -a "lowest ratio" "$table" | tee -a "$summary"
    done
  done
else
  note "benches skipped: a test or a sanitizer run did not pass"
fi
tar czf "$dest/logs.tgz" -C "$logs" .
[ $passed = 1 ]
