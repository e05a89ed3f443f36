#!/usr/bin/env bash
# The tests: installs what is missing, then runs every test of the workspace. GPU tests print a
# `SKIP <test>: no CUDA device answered` line where no device answers (--show-output keeps it visible).
# Then: the shipped PTX rebuilt from the kernel sources byte for byte, the library's docs, and a
# fresh downstream crate built with another toolchain (scripts/downstream-check.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --workspace "$@" -- --show-output
scripts/regen-ptx.sh --check
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p flash-attn -p attention-host -p attention-kernels
scripts/downstream-check.sh
