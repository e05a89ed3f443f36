#!/usr/bin/env bash
# Builds, on this machine, everything a GPU run needs and copies it to .device-run/ (git-ignored):
# the release `flash-attn` binary and every test binary of the workspace under stable names. With
# TUNING=1 also the timing examples that compare the tuning candidates, tc_bench and
# tc_backward_bench, and the test that checks every candidate against the f64 reference,
# gpu_variants, built with `--features tuning` (its own PTX, compiled from the kernel sources:
# several minutes) into .device-run/tuning/ (`bench-h200.sh tuning`).
# The GPU machine has no Rust. The binaries (two PTX modules each) outgrow what the device tool
# carries, so they also go packed into .device-pack/run.txz (git-ignored; xz with a dictionary
# larger than a binary, so the PTX every binary embeds is stored once): pass `.device-pack` in
# the device tool's `carry`, then run `scripts/device-unpack.sh` and scripts/device-run.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
# The binaries embed ptx/: refuse to carry PTX that the kernel sources no longer produce.
scripts/regen-ptx.sh --check
# Copies the test executables of the `cargo test --no-run --message-format=json` on stdin into
# DEST under stable names (a library's unit tests as NAME-unit).
copy_tests() {
  python3 -c '
import json, shutil, sys
dest = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        name = m["target"]["name"] + ("-unit" if m["target"]["kind"] == ["lib"] else "")
        shutil.copy(m["executable"], dest + "/" + name)
        print("prepared", dest + "/" + name)
' "$1"
}
rm -rf .device-run && mkdir -p .device-run/tests
cargo build --release --bins --quiet
cp target/release/flash-attn .device-run/
cargo build --release --example decode_bench --example generate --quiet
cp target/release/examples/decode_bench target/release/examples/generate .device-run/
# The large-tensor check (B=1, N=2^20, H=32/8, d=128; about 57 GiB of device memory): an example.
cargo build --release --example large_tensors --quiet
cp target/release/examples/large_tensors .device-run/
cargo test --workspace --release --no-run --message-format=json 2>/dev/null \
  | copy_tests .device-run/tests
if [[ ${TUNING:-0} == 1 ]]; then
  mkdir -p .device-run/tuning
  cargo build --release --features tuning --example tc_bench --example tc_backward_bench --quiet
  cp target/release/examples/tc_bench target/release/examples/tc_backward_bench .device-run/tuning/
  # The candidates against the f64 reference before they are timed.
  cargo test --release --features tuning --test gpu_variants --no-run --message-format=json 2>/dev/null \
    | copy_tests .device-run/tuning
fi
# The candle op when CANDLE=1 (feature `candle-cuda`, candle with its CUDA backend): its GPU test
# as .device-run/candle/gpu_candle, run there through candle-run.sh (`h200-check.sh candle`), and
# the GPT of crates/candle-gpt (a workspace of its own) as .device-run/gpt (`h200-check.sh gpt`).
# Needs the CUDA toolkit of scripts/candle-toolchain.sh. Both builds use target/candle, but the
# GPT's workspace resolves its dependencies' features apart, so candle (its nvcc kernels too) is
# compiled twice: 39 and 32 minutes cold on 2 cores (2026-12-01).
if [[ ${CANDLE:-0} == 1 ]]; then
  mkdir -p .device-run/candle
  candle_target=$PWD/target/candle
  (source <(scripts/candle-toolchain.sh --env) && CARGO_TARGET_DIR=$candle_target \
    cargo test --release -p flash-attn --features candle-cuda --test gpu_candle --no-run \
    --message-format=json 2>/dev/null) \
    | copy_tests .device-run/candle
  [[ -x .device-run/candle/gpu_candle ]] || { echo "device-prepare: the candle test did not build" >&2; exit 1; }
  (cd crates/candle-gpt && source <(../../scripts/candle-toolchain.sh --env) \
    && CARGO_TARGET_DIR=$candle_target cargo build --release --features cuda --quiet)
  cp "$candle_target/release/gpt" .device-run/gpt
  strip .device-run/candle/* .device-run/gpt
  cp scripts/candle-run.sh .device-run/
fi
# Symbols are not needed there and the carried folder is limited in size.
strip .device-run/flash-attn .device-run/decode_bench .device-run/generate .device-run/large_tensors \
  .device-run/tests/* $(ls .device-run/tuning/* 2> /dev/null)
cp scripts/device-run.sh scripts/device-sanitize.sh scripts/bench-h200.sh scripts/h200-check.sh .device-run/
# The GPU machine gets no .git: record which commit (and whether the tree was clean) was built.
echo "$(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!reports' || echo ' +uncommitted changes')" > .device-run/COMMIT
rm -rf .device-pack && mkdir -p .device-pack
tar cf - .device-run | xz -T2 --lzma2=preset=1,dict=512MiB > .device-pack/run.txz
du -sh .device-run .device-pack/run.txz
