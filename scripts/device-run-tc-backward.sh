#!/usr/bin/env bash
# Runs on the GPU machine (from anywhere) after scripts/device-prepare-tc-backward.sh: the
# backward's correctness test against the f64 reference, then its timing on the anchor shapes.
# Full logs go to $OUT (the device tool's output folder); a short summary is printed last.
set -uo pipefail
cd "$(dirname "$0")"
out=${OUT:-.}
echo "# built from $(cat COMMIT); $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader)"
timeout 100 ./gpu_tensor_core_backward --nocapture --test-threads=1 > "$out/test.txt" 2>&1
echo "test rc=$?"
grep -E "FAIL|seed|test result|panicked|SKIP" "$out/test.txt" | head -20
# Largest relative error per dtype over all cases (dQ, dK, dV together).
awk '/^(ok|FAIL) .* d=/ {n++; for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+e[-+][0-9]+$/ && $i + 0 > m[$2]) m[$2] = $i + 0}
     END {print n " cases; max relative error:"; for (k in m) print "  " k, m[k]}' "$out/test.txt"
timeout 110 ./tc_backward_bench > "$out/bench.txt" 2>&1
echo "bench rc=$?"
sed -n '/^backward, bf16/,$p' "$out/bench.txt"
tail -2 "$out/bench.txt"
