#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device-prepare.sh: one compute-sanitizer tool over one GPU
# test binary of .device-run/tests, under a time limit (the sanitizers slow kernels 10-100x), with
# optional VAR=value settings for the test and, after `--`, arguments of the test binary (a name
# filter). Logs to $OUT (or reports/device/).
# usage: device-sanitize.sh memcheck|racecheck SECONDS TEST_BINARY [VAR=value ...] [-- ARGS ...]
set -uo pipefail
tool=$1; limit=$2; test=$3; shift 3
vars=(); while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
out=${OUT:-reports/device}
mkdir -p "$out"
log="$out/sanitizer-$tool-$test.log"
echo "# built from commit $(cat .device-run/COMMIT); $tool on $test ${vars[*]} -- $*, limit ${limit}s" > "$log"
start=$(date +%s)
env "${vars[@]}" timeout "$limit" /usr/local/cuda/bin/compute-sanitizer --tool "$tool" --error-exitcode 3 \
  ".device-run/tests/$test" --test-threads=1 "$@" >> "$log" 2>&1
status=$?
echo "compute-sanitizer $tool on $test ${vars[*]} -- $*: exit status $status after $(( $(date +%s) - start )) s (124 = time limit)" | tee -a "$log"
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result|FLASH_ATTN_MATRIX" "$log" | tail -4
exit $status
