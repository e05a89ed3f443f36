#!/usr/bin/env bash
# The tests: installs what is missing, then runs every test of the workspace. GPU tests print a
# `SKIP <test>: no CUDA device answered` line where no device answers (--show-output keeps it visible).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --workspace "$@" -- --show-output
