# Sourced by the profile-*.sh scripts: sets `ncu` to Nsight Compute's command on this machine, or
# stops the script that sourced it with a message naming it.
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n1)
[ -n "$ncu" ] || { echo "$(basename "$0"): no ncu on this machine" >&2; exit 1; }
