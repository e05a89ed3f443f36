#!/usr/bin/env bash
# The tests: installs what is missing, then runs every test of the workspace. GPU tests print a
# `SKIP <test>: no CUDA device answered` line where no device answers (--show-output keeps it visible).
# Then: the `candle` feature's CPU test, the shipped PTX rebuilt from the kernel sources byte for
# byte, the library's docs, and a fresh downstream crate built with another toolchain
# (scripts/downstream-check.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --workspace "$@" -- --show-output
# The `candle` feature's CPU build: its shape checks and refusals, and its docs' example.
cargo test -p flash-attn --features candle --test candle_cpu "$@"
scripts/regen-ptx.sh --check
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --features candle -p flash-attn -p attention-host \
    -p attention-kernels
scripts/downstream-check.sh
