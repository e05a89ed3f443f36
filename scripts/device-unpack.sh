#!/usr/bin/env bash
# Runs on the GPU machine: restores .device-run/ from the .device-pack/run.tgz that
# scripts/device-prepare.sh packed, and names the commit it was built from.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .device-run && tar xzf .device-pack/run.tgz
echo "unpacked .device-run, built from $(cat .device-run/COMMIT)"
