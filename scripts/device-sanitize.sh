#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device-prepare.sh: compute-sanitizer memcheck and racecheck
# over GPU test binaries of .device-run/tests (default: gpu_exact, the whole matrix), each tool
# under a time limit (the sanitizers slow kernels 10-100x). Logs to $OUT (or reports/device/).
# usage: device-sanitize.sh SECONDS_PER_TOOL [TEST_BINARY_NAME ...]
set -uo pipefail
limit=${1:-240}; shift || true
tests=("${@:-gpu_exact}")
out=${OUT:-reports/device}
mkdir -p "$out"
san=/usr/local/cuda/bin/compute-sanitizer
for t in "${tests[@]}"; do
  for tool in memcheck racecheck; do
    log="$out/sanitizer-$tool-$t.log"
    echo "# built from commit $(cat .device-run/COMMIT); $tool on $t, limit ${limit}s" > "$log"
    start=$(date +%s)
    timeout "$limit" "$san" --tool "$tool" --error-exitcode 3 ".device-run/tests/$t" --test-threads=1 >> "$log" 2>&1
    status=$?
    echo "compute-sanitizer $tool on $t: exit status $status after $(( $(date +%s) - start )) s (124 = time limit)" | tee -a "$log"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" "$log" | tail -3
  done
done
