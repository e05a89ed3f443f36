#!/usr/bin/env bash
# Regenerates the PTX shipped in ptx/ from attention-kernels with the pinned toolchain (the
# `rebuild-ptx` feature's child build) and records what it came from in ptx/kernel-sources.sha256:
# the SHA-256 of every kernel source, of the build script and toolchain file that decide the flags
# and the compiler, and of the two modules (tests/ptx_shipped.rs checks the record). Run it after
# changing the kernels, and commit ptx/. Where ptxas is found, it also assembles the sm_90a module
# and fails (writing nothing) on any "Potential Performance Loss" note: ptxas serializing a kernel's
# wgmma products (C7520 made the d = 192 forward 5–6× slower) shows nowhere else on a CPU machine.
#   scripts/regen-ptx.sh           write ptx/ (files whose bytes do not change are left alone)
#   scripts/regen-ptx.sh --check   rebuild and compare byte for byte; fails when ptx/ is stale
set -euo pipefail
cd "$(dirname "$0")/.."
check=false
case "${1:-}" in
    --check) check=true ;;
    "") ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac
if [ -n "${FLASH_ATTN_ARCH:-}" ]; then
    echo "regen-ptx: unset FLASH_ATTN_ARCH (the shipped base module is the default, sm_80)" >&2
    exit 2
fi

# The modules this feature set's build script compiled are in its own OUT_DIR (target/ptx is
# shared with `tuning` builds, whose PTX holds the candidate tiles too).
out_dir=$(cargo build -p flash-attn --lib --features rebuild-ptx --message-format=json \
    | python3 -c '
import json, re, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "build-script-executed" and re.search(r"[#/]flash-attn[@#]", m["package_id"]):
        print(m["out_dir"])
')
[ -n "$out_dir" ] || { echo "regen-ptx: the flash-attn build script did not report its OUT_DIR" >&2; exit 1; }

# Everything the PTX is a function of, besides the modules themselves.
sources() {
    echo attention-kernels/Cargo.toml build.rs rust-toolchain.toml
    find attention-kernels/src -type f | LC_ALL=C sort
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/ptx"
cp "$out_dir/attention_kernels.ptx" "$out_dir/attention_kernels_sm90a.ptx" "$tmp/ptx/"
{
    sha256sum $(sources)
    (cd "$tmp" && sha256sum ptx/attention_kernels.ptx ptx/attention_kernels_sm90a.ptx)
} > "$tmp/ptx/kernel-sources.sha256"

# ptxas as crates/cli finds it: $PTXAS, PATH, the nvidia-cuda-nvcc-cu12 wheel (scripts/setup.sh),
# /usr/local/cuda.
ptxas=${PTXAS:-$(command -v ptxas || true)}
if [ -z "$ptxas" ]; then
    for p in "$(python3 -c 'import nvidia.cuda_nvcc, os; print(os.path.join(list(nvidia.cuda_nvcc.__path__)[0], "bin", "ptxas"))' 2>/dev/null)" \
        /usr/local/cuda/bin/ptxas; do
        if [ -x "$p" ]; then ptxas=$p; break; fi
    done
fi
if [ -n "$ptxas" ]; then
    notes=$("$ptxas" -arch=sm_90a -o /dev/null "$tmp/ptx/attention_kernels_sm90a.ptx" 2>&1) || {
        echo "$notes" >&2
        exit 1
    }
    if grep 'Potential Performance Loss' <<<"$notes" >&2; then
        echo "regen-ptx: ptxas serializes the kernels above ($out_dir/attention_kernels_sm90a.ptx); ptx/ left alone" >&2
        exit 1
    fi
    echo "regen-ptx: ptxas ($ptxas) assembles the sm_90a module with no performance-loss note"
else
    echo "regen-ptx: SKIP the ptxas check of the sm_90a module: no ptxas (\$PTXAS, PATH, scripts/setup.sh's wheel, /usr/local/cuda)" >&2
fi

stale=""
for f in attention_kernels.ptx attention_kernels_sm90a.ptx kernel-sources.sha256; do
    if ! cmp -s "$tmp/ptx/$f" "ptx/$f"; then
        stale="$stale $f"
        $check || cp "$tmp/ptx/$f" "ptx/$f"
    fi
done
if [ -z "$stale" ]; then
    echo "regen-ptx: ptx/ matches the kernels rebuilt from the sources"
elif $check; then
    echo "regen-ptx --check: ptx/ is stale (differs:$stale); run scripts/regen-ptx.sh and commit ptx/" >&2
    exit 1
else
    echo "regen-ptx: wrote$stale"
fi
