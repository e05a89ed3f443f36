#!/usr/bin/env bash
# Lays out the CUDA 13.4 toolkit (CCCL headers 13.3.5: <nv/target>, which cuda_fp16.h includes) that candle-core's `cuda` feature needs to build (candle-kernels
# runs nvcc; cudarc 0.19.10's build script accepts nvcc up to 13.4) from PyPI wheels, in a
# directory of its own so the nvidia-cuda-nvcc-cu12 ptxas used by scripts/regen-ptx.sh is untouched.
#
#   scripts/candle-toolchain.sh            # installs into $CUDA13 (default /work/cuda13), ~1.2 GB
#   source <(scripts/candle-toolchain.sh --env)   # exports PATH, CUDA_ROOT, ... for cargo
set -euo pipefail
CUDA13=${CUDA13:-/work/cuda13}
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
$PY -m pip install --no-deps --target "$CUDA13/site-packages" \
    nvidia-cuda-nvcc==13.4.92 nvidia-cuda-crt==13.4.92 nvidia-cuda-runtime==13.4.92 \
    nvidia-nvvm==13.4.92 nvidia-cuda-nvrtc==13.4.92 nvidia-curand==10.4.4.72 \
    nvidia-cublas==13.4.3.11 nvidia-cuda-cccl==13.3.5.0.6

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
