#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs `flash-attn run` (extra arguments are
# passed on, e.g. `--causal`). On a GPU: the running fixture; without one: the CPU path.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo run --release --quiet -- run "$@"
