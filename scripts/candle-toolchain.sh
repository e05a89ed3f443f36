#!/usr/bin/env bash
# Lays out the CUDA toolkit that candle-core's `cuda` feature needs to build (candle-kernels runs
# nvcc) from PyPI wheels, in a directory of its own so the nvidia-cuda-nvcc-cu12 ptxas used by
# scripts/regen-ptx.sh is untouched. CUDA 13.0: the H200 machine's driver (580, CUDA 13.0) loads
# no PTX of a later ISA (nvcc 13.4 writes `.version 9.4`), and its PyTorch (cu130) ships the 13.0
# libraries the binary links (libcublas.so.13, libcurand.so.10, libnvrtc.so.13, libcudart.so.13).
# cudarc's nvcc version check (13.4 at most) does not run here: flash-attn fixes cudarc's bindings
# at CUDA 12.3. The CCCL headers give <nv/target>, which cuda_fp16.h includes. pip --target does
# not merge into an existing nvidia/ directory: all wheels go in one command, into a fresh $CUDA13.
#
#   scripts/candle-toolchain.sh            # installs into $CUDA13 (default /work/cuda13.0), ~1.2 GB
#   source <(scripts/candle-toolchain.sh --env)   # exports PATH, CUDA_ROOT, ... for cargo
set -euo pipefail
CUDA13=${CUDA13:-/work/cuda13.0}
ROOT=$CUDA13/site-packages/nvidia/cu13
LINKS=$CUDA13/links

if [[ ${1:-} == --env ]]; then
    cat <<ENV
export PATH=$ROOT/bin:\$PATH
export CUDA_ROOT=$ROOT CUDA_PATH=$ROOT CUDA_HOME=$ROOT
export CUDA_COMPUTE_CAP=90
export RUSTFLAGS="-L $LINKS \${RUSTFLAGS:-}"
export LIBRARY_PATH=$LINKS\${LIBRARY_PATH:+:\$LIBRARY_PATH}
ENV
    exit 0
fi

PY=${PYTHON:-python3}
[[ ! -e $CUDA13/site-packages/nvidia ]] || { echo "candle-toolchain: $CUDA13 exists; remove it first" >&2; exit 1; }
$PY -m pip install --no-deps --target "$CUDA13/site-packages" \
    nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96 \
    nvidia-nvvm==13.0.88 nvidia-cuda-nvrtc==13.0.88 nvidia-curand==10.4.0.35 \
    nvidia-cublas==13.0.2.14 nvidia-cuda-cccl==13.0.85

# The wheels ship lib/ only; candle-kernels' build looks in lib64 too.
[[ -e $ROOT/lib64 ]] || ln -s lib "$ROOT/lib64"
# The wheels ship only versioned sonames (libcudart.so.13, ...); the linker wants unversioned names.
mkdir -p "$LINKS"
for stem in libcudart libcublas libcublasLt libnvrtc libcurand; do
    real=$(ls "$ROOT"/lib/$stem.so.* 2>/dev/null | sort | head -1)
    [[ -n $real ]] || { echo "candle-toolchain: no $stem.so.* under $ROOT/lib" >&2; exit 1; }
    ln -sf "$real" "$LINKS/$stem.so"
done
"$ROOT/bin/nvcc" --version | tail -2
echo "candle-toolchain: ready; source <($0 --env)"
