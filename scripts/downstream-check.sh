#!/usr/bin/env bash
# What a new user does: a fresh crate (in a temp dir) that depends on flash-attn by path, built with
# a toolchain other than the pinned one and only its default components (no rust-src, llvm-tools,
# llvm-bitcode-linker), with no CUDA toolkit and no CUDA variable set. It must build, start, get
# `NoDevice` from `flash_attn::gpu()` where no GPU answers, and plan a call on the CPU. Where the
# machine lets it, the binary also runs once with libcuda hidden (a private mount namespace).
# A second crate enables the `candle` feature and gets the op's refusal of CPU tensors.
#   scripts/downstream-check.sh [TOOLCHAIN]     (default 1.96.0; installed if missing)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
toolchain=${1:-1.96.0}
pinned=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' "$root/rust-toolchain.toml")
if [ "$toolchain" = "$pinned" ]; then
    echo "downstream-check: pick a toolchain other than the pinned $pinned" >&2
    exit 2
fi
rustup toolchain list | grep -q "^$toolchain" || rustup toolchain install "$toolchain" --profile minimal
echo "downstream-check: $(rustup run "$toolchain" rustc --version), components:" \
    $(rustup component list --toolchain "$toolchain" --installed | sed 's/-x86_64.*//' | tr '\n' ' ')

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/downstream/src"
cat > "$dir/downstream/Cargo.toml" <<TOML
[package]
name = "downstream"
version = "0.1.0"
edition = "2024"

[dependencies]
flash-attn = { path = "$root" }
TOML
cat > "$dir/downstream/src/main.rs" <<'RUST'
use flash_attn::plan::select;
use flash_attn::{
    AttentionError, AttentionOptions, AttentionShape, DType, DeviceCaps, Direction, FlashOptions,
    Problem,
};

fn main() -> Result<(), AttentionError> {
    match flash_attn::gpu() {
        Err(AttentionError::NoDevice(why)) => println!("gpu(): NoDevice: {why}"),
        Ok(gpu) => println!("gpu(): {} answered", gpu.device_name()),
        Err(e) => panic!("gpu() must start or report NoDevice, got: {e}"),
    }
    // batch, n_q, n_k, heads_q, heads_kv, head_dim; V and O rows of 128 beside Q and K of 192.
    let shape = AttentionShape::new(2, 1000, 1000, 8, 2, 192).with_head_dim_v(128);
    let options = FlashOptions::new(AttentionOptions::new().causal(true));
    let problem = Problem::new(&shape, DType::Bf16, &options)?;
    let device = DeviceCaps::for_arch("sm_90", true)?;
    print!("{}", select(&device, &problem, Direction::Forward)?);
    print!("{}", select(&device, &problem, Direction::Backward)?);
    println!("embedded PTX: base {} ({} bytes), sm_90a {} bytes, {}", flash_attn::PTX_ARCH,
        flash_attn::PTX.len(), flash_attn::PTX_SM90A.map_or(0, str::len), flash_attn::PTX_ORIGIN);
    Ok(())
}
RUST

# Builds the crate in the current directory with $toolchain and says how long it took.
timed_build() {
    local start ms
    start=$(date +%s%N)
    cargo "+$toolchain" build --quiet
    ms=$((($(date +%s%N) - start) / 1000000))
    printf 'downstream-check: cargo +%s build %s took %d.%01d s\n' "$toolchain" "$1" $((ms / 1000)) $((ms % 1000 / 100))
}
cd "$dir/downstream"
# Nothing of CUDA or of the project's own build environment reaches this build.
unset CUDA_LIBRARY_PATH CUDA_PATH CUDA_HOME CUDA_ROOT CUDA_TOOLKIT_ROOT_DIR RUSTC_BOOTSTRAP \
    RUSTUP_TOOLCHAIN RUSTFLAGS CARGO_BUILD_RUSTFLAGS FLASH_ATTN_ARCH
export CARGO_TARGET_DIR="$dir/target"
timed_build "(debug, fresh target dir)"
bin="$CARGO_TARGET_DIR/debug/downstream"
"$bin"

# Again with every libcuda on the machine hidden: libcuda cannot be loaded, still a clean NoDevice.
libs=$(ldconfig -p | sed -n 's/.*libcuda\.so[.0-9]* .*=> //p' | xargs -r readlink -f | sort -u)
if [ -n "$libs" ] && [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
    mounts=$(for l in $libs; do printf 'mount --bind /dev/null %s && ' "$l"; done)
    echo "downstream-check: again with libcuda hidden ($(echo $libs))"
    unshare -m sh -c "$mounts \"$bin\"" | grep '^gpu():'
else
    echo "downstream-check: libcuda is absent here or cannot be hidden; the run above covered $([ -n "$libs" ] && echo 'the driver without a GPU' || echo 'no libcuda')"
fi
# The `candle` feature as a dependent enables it: candle's CPU backend builds with the same
# toolchain and components, and the op refuses CPU tensors with an error (no device needed).
mkdir -p "$dir/downstream-candle/src"
cat > "$dir/downstream-candle/Cargo.toml" <<TOML
[package]
name = "downstream-candle"
version = "0.1.0"
edition = "2024"

[dependencies]
flash-attn = { path = "$root", features = ["candle"] }
candle-core = { version = "=0.11.1", default-features = false }
TOML
cat > "$dir/downstream-candle/src/main.rs" <<'RUST'
use candle_core::{DType, Device, Tensor};
use flash_attn::{AttentionOptions, FlashOptions};

fn main() -> candle_core::Result<()> {
    let q = Tensor::randn(0f32, 1., (1, 16, 2, 64), &Device::Cpu)?.to_dtype(DType::BF16)?;
    let options = FlashOptions::new(AttentionOptions::new().causal(true));
    let err = flash_attn::candle::flash_attn(&q, &q, &q, &options).expect_err("CPU tensors");
    assert!(err.to_string().contains("runs on CUDA devices"), "{err}");
    println!("candle op on CPU tensors: refused ({})", err.to_string().lines().next().unwrap_or(""));
    Ok(())
}
RUST
cd "$dir/downstream-candle"
timed_build "with features = [\"candle\"]"
"$CARGO_TARGET_DIR/debug/downstream-candle"
echo "downstream-check: ok"
