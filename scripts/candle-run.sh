#!/usr/bin/env bash
# Runs a binary built with the `candle-cuda` feature (tests/gpu_candle.rs, crates/candle-gpt; so
# linked against the CUDA 13 libraries candle uses: libcublas, libcublasLt, libcurand, libnvrtc;
# libcuda from the driver) on a machine without a CUDA toolkit: the libraries come from the pip
# wheels PyTorch installs (site-packages/nvidia/**/lib), or from CANDLE_CUDA_LIBS (a ':' list of
# directories).
#   scripts/candle-run.sh .device-run/candle/gpu_candle --test-threads=1 --nocapture
set -euo pipefail
bin=$1
if [[ -z ${CANDLE_CUDA_LIBS:-} ]]; then
    dirs=()
    for py in python3 python; do
        command -v $py > /dev/null || continue
        for site in $($py -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))'); do
            [[ -d $site/nvidia ]] || continue
            while read -r d; do dirs+=("$d"); done < <(find "$site/nvidia" -maxdepth 3 \
                \( -name 'libcublas*.so.*' -o -name 'libcurand.so.*' -o -name 'libnvrtc.so.*' -o -name 'libcudart.so.*' \) \
                -printf '%h\n' | sort -u)
        done
        break
    done
    CANDLE_CUDA_LIBS=$(IFS=:; echo "${dirs[*]:-}")
fi
export LD_LIBRARY_PATH=$CANDLE_CUDA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "candle-run: LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
if missing=$(ldd "$bin" | grep "not found"); then
    echo "candle-run: $bin cannot start, libraries not found:" >&2
    echo "$missing" >&2
    exit 127
fi
exec "$@"
