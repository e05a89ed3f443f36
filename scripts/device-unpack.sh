#!/usr/bin/env bash
# Runs on the GPU machine: restores .device-run/ from the .device-pack/run.txz that
# scripts/device-prepare.sh packed, and names the commit it was built from.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .device-run
if command -v xz > /dev/null; then
  xz -dc .device-pack/run.txz | tar xf -
else
  python3 -c 'import lzma, sys, shutil; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' \
    .device-pack/run.txz | tar xf -
fi
touch .device-run/.unpacked  # h200-check.sh: this pack is unpacked
echo "unpacked .device-run, built from $(cat .device-run/COMMIT)"
