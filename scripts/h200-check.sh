#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device-prepare.sh (carry .device-pack): everything issue 9
# asks the H200 for, in one call, each step under its own time limit so the call ends inside the
# device tool's 10 minutes. $OUT (or reports/device/) gets summary.txt and logs.tgz with every
# log (the device tool returns at most eight files).
#   tests     every test binary, GPU tests for real, with --show-output (each case's family shows)
#   job       the main job on the fixture with every family side by side, plain and causal
#             (JOB_S seconds each, default 300: the exact family alone takes about 100 s causal;
#             JOB_KERNELS, default auto,sm90,sm80,exact, names the families)
#   memcheck  compute-sanitizer memcheck over the GPU matrix and the non-finite tests, per family
#   racecheck the same under racecheck (the exact family's matrix cases up to head dim 64: its
#             SIMT kernels make every shared-memory access a racecheck event)
#   window    issue 10 item 2's correctness runs alone: the score-modifier matrix and the
#             non-finite cases (window scenarios included) per family; window-only cases of
#             full-length sequences run sm90's `window` instances (the plan's CPU tests show which)
#   candle    tests/gpu_candle.rs (feature candle-cuda: the candle op against candle's f32 attention and the f64
#             reference), when device-prepare.sh ran with CANDLE=1; CUDA libraries from PyTorch's
#             wheels through candle-run.sh
#   gpt       crates/candle-gpt: a small GPT trained with the flash op, with candle's
#             own attention and with candle's f32 attention (the bf16 noise reference), same seed
#             and batches; its table, its check (exit 1: the curves disagree beyond bf16 noise)
#             and gpt.json (every step's loss and time; scripts/plot-gpt.py draws it) into $OUT;
#             GPT_ARGS adds options (e.g. "--steps 500"). Prepared by device-prepare.sh CANDLE=1
# usage: h200-check.sh [tests] [job] [memcheck] [racecheck] [window] [candle] [gpt]   (default: the
#        first four, and candle and gpt where they were prepared)
# Unpacks .device-pack unless .device-run already holds that pack, so two instances with different
# OUT may run at once after one unpack (correctness steps only: timings want the GPU alone).
set -uo pipefail
cd "$(dirname "$0")/.."
dest=${OUT:-reports/device}
mkdir -p "$dest"
out=$(mktemp -d)
scripts/device-unpack.sh --if-needed
steps=${*:-tests job memcheck racecheck $([ -d .device-run/candle ] && echo candle) $([ -x .device-run/gpt ] && echo gpt)}
status=0
note() { echo "$*" | tee -a "$out/summary.txt"; }
note "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); built from $(cat .device-run/COMMIT)"

for step in $steps; do case $step in
tests)
  for t in .device-run/tests/*; do
    name=$(basename "$t")
    case $name in cli_*) continue;; esac  # runs the binary at its build path: CPU machine only
    timeout 240 "$t" --test-threads=1 --show-output > "$out/test-$name.log" 2>&1
    rc=$?; [ $rc = 0 ] || status=1
    note "test $name: exit $rc, $(grep -h 'test result' "$out/test-$name.log" | tail -1)"
    # A failing binary's failed cases and input seeds go into the summary itself, so that they
    # survive when logs.tgz does not come back (rerun with FLASH_ATTN_TEST_SEED).
    [ $rc = 0 ] || grep -ah "^FAIL \|input seed\|panicked" "$out/test-$name.log" | head -40 | tee -a "$out/summary.txt"
  done
  grep -h "ran [0-9]* of\|SKIP" "$out"/test-*.log | tee -a "$out/summary.txt";;
candle)
  for t in .device-run/candle/*; do
    name=$(basename "$t")
    timeout 240 .device-run/candle-run.sh "$t" --test-threads=1 --nocapture > "$out/candle-$name.log" 2>&1
    rc=$?; [ $rc = 0 ] || status=1
    note "candle $name: exit $rc, $(grep -h 'test result' "$out/candle-$name.log" | tail -1)"
    grep -h "vs \|SKIP\|candle-run" "$out/candle-$name.log" | tee -a "$out/summary.txt"
  done;;
gpt)
  timeout 300 .device-run/candle-run.sh .device-run/gpt --attention both --out "$out/gpt.json" ${GPT_ARGS:-} > "$out/gpt.log" 2>&1
  rc=$?; [ $rc = 0 ] || status=1
  note "gpt: exit $rc"
  sed -n '/^attention /,$p' "$out/gpt.log" | tee -a "$out/summary.txt"
  [ -f "$out/gpt.json" ] && cp "$out/gpt.json" "$dest/";;
job)
  for causal in "" --causal; do
    timeout ${JOB_S:-300} .device-run/flash-attn run $causal --kernel ${JOB_KERNELS:-auto,sm90,sm80,exact} > "$out/main-job$causal.log" 2>&1
    rc=$?; [ $rc = 0 ] || status=1
    note "main job $causal: exit $rc"; grep -E "forward|backward" "$out/main-job$causal.log" | grep -v "^direction" | tee -a "$out/summary.txt"
  done;;
window)
  for family in ${WINDOW_FAMILIES:-sm90 sm80 exact}; do
    for run in "gpu_matrix score_modifiers_on_every_family" "gpu_non_finite"; do
      set -- $run; t=$1; shift
      log="$out/window-$t-$family.log"
      FLASH_ATTN_FAMILIES=$family timeout 240 .device-run/tests/$t "$@" --test-threads=1 --show-output > "$log" 2>&1
      rc=$?; [ $rc = 0 ] || status=1
      note "window $t $family: exit $rc, $(grep -h 'test result' "$log" | tail -1); $(grep -h ' ran [0-9]* of' "$log" | tail -1)"
    done
  done;;
memcheck|racecheck)
  # Sequences up to 333 (several tiles and tails per family) keep the sanitizers inside their
  # limits. Under racecheck the exact family runs its own domain's cases up to head dim 64 only
  # (its SIMT kernels make every shared-memory access a racecheck event), for RACECHECK_EXACT_S
  # seconds (default 240); its non-finite cases run under memcheck. MEMCHECK_S and RACECHECK_S
  # (default 50 and 80) bound every other run; SANITIZE_FAMILIES (default "exact sm80 sm90")
  # names the families.
  for family in ${SANITIZE_FAMILIES:-exact sm80 sm90}; do
    for t in gpu_matrix gpu_non_finite; do
      [ -x .device-run/tests/$t ] || continue
      limit=$([ $step = memcheck ] && echo ${MEMCHECK_S:-50} || echo ${RACECHECK_S:-80}); vars=(); filter=()
      if [ $step = racecheck ] && [ $family = exact ]; then
        [ $t = gpu_matrix ] || continue
        limit=${RACECHECK_EXACT_S:-240}; vars=(FLASH_ATTN_MATRIX_MAX_HEAD_DIM=64); filter=(exact_domain)
      fi
      OUT=$out scripts/device-sanitize.sh $step $limit $t \
        FLASH_ATTN_FAMILIES=$family FLASH_ATTN_MATRIX_MAX_LEN=333 "${vars[@]}" \
        -- --nocapture "${filter[@]}" > /dev/null
      rc=$?; [ $rc = 0 ] || status=1  # a finding, or a run the time limit cut short
      log="$out/sanitizer-$step-$t.log"; mv "$log" "$out/sanitizer-$step-$t-$family.log"
      note "$step $t $family: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer-$step-$t-$family.log" | tail -1) $(grep -c '^ok ' "$out/sanitizer-$step-$t-$family.log") cases ok; $(tail -1 "$out/sanitizer-$step-$t-$family.log")"
    done
  done;;
esac; done
note "h200-check status: $status"
cp "$out/summary.txt" "$dest/" && tar czf "$dest/logs.tgz" -C "$out" .
exit $status
