#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after scripts/device-prepare.sh built
# .device-run/ here: every test binary (GPU tests run for real there), then the main job.
# Logs go to $OUT (the device tool's output folder) or reports/device/.
set -uo pipefail
out=${OUT:-reports/device}
mkdir -p "$out"
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
  echo "# built from commit $(cat .device-run/COMMIT)"
} | tee "$out/gpu-tests.log"
status=0
for t in .device-run/tests/*; do
  echo "## $(basename "$t")" | tee -a "$out/gpu-tests.log"
  # CLI tests run the binary at the path cargo built it, which exists only on the build machine.
  case $(basename "$t") in cli_*) echo "(CPU-only CLI test: runs where it was built)" | tee -a "$out/gpu-tests.log"; continue;; esac
  "$t" --test-threads=1 --show-output 2>&1 | tee -a "$out/gpu-tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
.device-run/flash-attn run "$@" 2>&1 | tee "$out/main-job.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
echo "device-run status: $status"
exit $status
