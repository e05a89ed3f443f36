#!/usr/bin/env bash
# The next device call (twenty-second session: the device tool paused its loans before this one
# ran): one call that fits the card that comes. Copy it to .device-pack/call.sh, run
# `.device-pack/call.sh` there (carry .device-pack).
#   H200: main's build (.device-pack/run-main.txz) for the issue tables (TASK="headdims decode
#         speed", bench-h200.sh; LIMIT seconds each). AB=1 runs the H100 branch instead.
#   H100: B (.device-pack/run.txz: main + decode-l2-prefetch.patch + forward-checkers.patch +
#         forward-q-tma.patch) against main: B's gpu_matrix, gpu_variants and gpu_non_finite,
#         then the forward anchors rows (d = 64 and 128) as a stack A → c → B (ab-session.sh
#         STACK=c; A = .device-pack/flash-attn-a.xz, main's CLI; c = flash-attn-c.xz, main +
#         the first two patches; within BUDGET seconds). TASK=decode (a second call): the
#         decode rows 1-5 A/B (main's decode_bench from run-main.txz, DEC_LIMIT seconds a run).
#         Two alternated rounds each.
# Packing (README.md here): device-prepare.sh on main, keep its run.txz as run-main.txz and the
# CLI inside it (.device-run/flash-attn) as `xz -c` flash-attn-a.xz; apply the first two
# patches, regen-ptx.sh, device-prepare.sh, keep its CLI as flash-attn-c.xz; apply the third,
# regen-ptx.sh, device-prepare.sh (which empties .device-pack: move the three files back in).
set -uo pipefail
cd "$(dirname "$0")/.."
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
t0=$SECONDS
if [[ "$gpu" == *H200* ]] && [ -z "${AB:-}" ]; then
  scripts/device-unpack.sh --if-needed .device-pack/run-main.txz
  echo "built from $(cat .device-run/COMMIT)"
  for task in ${TASK:-headdims}; do
    mkdir -p "$OUT/$task"
    OUT="$OUT/$task" timeout ${LIMIT:-500} scripts/bench-h200.sh "$task" > "$OUT/$task/$task.log" 2>&1
    echo "$task exit $? ($((SECONDS-t0)) s)"; tail -n 25 "$OUT/$task/$task.log"
  done
  ls -la "$OUT"
  exit
fi
if [ "${TASK:-ab}" = ab ]; then
  # Three builds' PTX to load (~100 s each on a fresh machine), then the tests and the stack.
  TESTS="${TESTS-gpu_matrix gpu_variants gpu_non_finite}" ROUNDS=2 PEERS=0 STACK=c \
    BUDGET=${BUDGET:-560} SHAPES="${SHAPES:-anchors:--pass=forward}" \
    OUT=$OUT/ab scripts/ab-session.sh
  echo "ab exit $? ($((SECONDS-t0)) s)"
  ls -la "$OUT/ab"
  exit
fi
# TASK=decode (a second call, on the warm machine).
scripts/device-unpack.sh --if-needed
a=$(mktemp -d)
xz -dc .device-pack/run-main.txz | tar xf - -C "$a" .device-run/decode_bench
dec=$(mktemp -d)
for r in 1 2; do
  for w in a b; do
    bin=.device-run/decode_bench
    [ $w = a ] && bin=$a/.device-run/decode_bench
    mkdir -p "$dec/$w-$r"
    timeout ${DEC_LIMIT:-120} $bin --no-caches --combine last-split --rows 1,2,3,4,5 \
      --out "$dec/$w-$r" > "$dec/$w-$r.log" 2>&1
    echo "decode $w-$r exit $? ($((SECONDS-t0)) s)"; grep -E 'ms per call' "$dec/$w-$r.log"
  done
done
tar czf "$OUT/decode-ab.tgz" -C "$dec" .
ls -la "$OUT"
