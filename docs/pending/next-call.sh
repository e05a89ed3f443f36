#!/usr/bin/env bash
# The next device call, written in the twenty-first session (which got no machine): one call that
# fits the card that comes. Copy it to .device-pack/call.sh and run `.device-pack/call.sh` there.
#   H200: main's build (.device-pack/run-main.txz) for the issue tables (TASK="headdims decode
#         speed", bench-h200.sh; LIMIT seconds each).
#   H100: A/B of move-closures-forward.patch (.device-pack/run.txz, main + the patch) against
#         main's CLI (.device-pack/flash-attn-a.xz), ab-session.sh within BUDGET seconds;
#         TASK=profile: the source counters of main's d = 128 forward on the short causal row.
# Packing (README.md here): device-prepare.sh on main, keep its run.txz as run-main.txz and the
# CLI inside it (.device-run/flash-attn) as `xz -c` flash-attn-a.xz; apply the patch,
# regen-ptx.sh, device-prepare.sh (which empties .device-pack: move the two files back in).
set -uo pipefail
cd "$(dirname "$0")/.."
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
t0=$SECONDS
if [[ "$gpu" == *H200* ]]; then
  scripts/device-unpack.sh --if-needed .device-pack/run-main.txz
  echo "built from $(cat .device-run/COMMIT)"
  for task in ${TASK:-headdims}; do
    mkdir -p "$OUT/$task"
    OUT="$OUT/$task" timeout ${LIMIT:-500} scripts/bench-h200.sh "$task" > "$OUT/$task/$task.log" 2>&1
    echo "$task exit $? ($((SECONDS-t0)) s)"; tail -n 25 "$OUT/$task/$task.log"
  done
elif [ "${TASK:-}" = profile ]; then
  # Source counters of main's (A's) d = 128 forward on the short causal row.
  a=$(mktemp -d)/flash-attn-a; xz -dc .device-pack/flash-attn-a.xz > "$a"; chmod +x "$a"
  OUT=$OUT timeout ${LIMIT:-200} scripts/profile-source.sh fwd-short-causal 'flash_wgmma_forward_bf16_d128_g2_k128$' 3 -- \
    "$a" bench --shapes anchors --head-dim 128 --pass forward --causal true --calls 1 --samples 20 --warmup 1 --out "$(mktemp -d)"
  echo "exit $? ($((SECONDS-t0)) s)"
else
  TESTS="${TESTS-gpu_matrix gpu_variants gpu_non_finite}" ROUNDS=2 PEERS=0 BUDGET=${BUDGET:-${LIMIT:-560}} \
    SHAPES="${SHAPES:-anchors:--pass=forward+--head-dim=128 headdims:--pass=forward}" scripts/ab-session.sh
  echo "exit $? ($((SECONDS-t0)) s)"
fi
ls -la "$OUT"
