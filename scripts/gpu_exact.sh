#!/usr/bin/env bash
# GPU run of the exact-attention tests (issue 4). Run from a folder holding the test binary
# `gpu_exact` (built on a CPU machine with `cargo test --release --no-run`); writes logs to $OUT
# (default: .). Order: the full matrix and every other test, then compute-sanitizer memcheck and
# racecheck on the smaller cases (the sanitizers slow kernels by 10-100x; the block-size test
# runs every schedule, causal, dropout, GQA and tail path of both directions on small shapes).
set -uo pipefail
out=${OUT:-.}
bin=./gpu_exact
san=/usr/local/cuda/bin/compute-sanitizer
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu_exact_h200.log"
$bin --test-threads=1 --nocapture 2>&1 | tee -a "$out/gpu_exact_h200.log"
small="every_block_size_gives_the_same_result"
for tool in memcheck racecheck; do
    timeout 100 $san --tool $tool --error-exitcode 3 $bin --test-threads=1 --nocapture "$small" \
        > "$out/sanitizer_$tool.log" 2>&1
    echo "compute-sanitizer $tool exit status $?" | tee -a "$out/sanitizer_$tool.log"
    tail -3 "$out/sanitizer_$tool.log"
done
