#!/usr/bin/env bash
# Installs what building and testing need on a fresh Debian machine of this project's kind.
# Safe to run again: every step checks first and does nothing when its piece is already there.
#   - the pinned Rust toolchain and the components the kernel build needs (rust-toolchain.toml)
#   - Debian non-free `libcuda1`, so the tests also run against a driver that finds no GPU (the
#     runtime opens libcuda at run time and reports NoDevice without it just the same)
#   - the `ptxas` wheel (nvidia-cuda-nvcc-cu12), for resource reports of the PTX
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
sudo_if() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

toolchain=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' "$root/rust-toolchain.toml")
components=$(sed -n 's/^components *= *\[\(.*\)\]/\1/p' "$root/rust-toolchain.toml" | tr -d '"' | tr ',' ' ')
if ! rustup toolchain list | grep -q "^$toolchain"; then
    rustup toolchain install "$toolchain" --profile minimal
fi
missing=""
for c in $components; do
    rustup component list --toolchain "$toolchain" --installed | grep -q "^$c" || missing="$missing $c"
done
[ -z "$missing" ] || rustup component add $missing --toolchain "$toolchain"

if ! ldconfig -p | grep -q 'libcuda.so.1'; then
    src=/etc/apt/sources.list.d/debian-non-free.sources
    if [ ! -f "$src" ]; then
        mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
        printf 'Types: deb\nURIs: %s\nSuites: bookworm bookworm-updates\nComponents: contrib non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
            "${mirror:-http://deb.debian.org/debian}" | sudo_if tee "$src" >/dev/null
    fi
    sudo_if apt-get update -qq
    DEBIAN_FRONTEND=noninteractive sudo_if apt-get install -y -qq libcuda1 >/dev/null
fi

ptxas_path() { python3 -c 'import nvidia.cuda_nvcc, os; print(os.path.join(list(nvidia.cuda_nvcc.__path__)[0], "bin", "ptxas"))' 2>/dev/null; }
if ! [ -x "$(ptxas_path)" ]; then
    python3 -m pip install -q --disable-pip-version-check 'nvidia-cuda-nvcc-cu12==12.9.*'
fi
echo "setup: toolchain $toolchain with [$components ], $(ldconfig -p | grep -m1 -o "libcuda.so.1 .*=> .*" | sed "s/.*=> //"), ptxas $(ptxas_path)"
