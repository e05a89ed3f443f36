#!/usr/bin/env bash
# Runs on the GPU machine: the same `flash-attn bench` cases with two builds of the CLI in one
# call, alternated (A, B, A, B, …) so that clock and thermal drift fall on both; prints each
# case's median per build and B / A. For a kernel change whose gain is near the run-to-run spread
# of separate calls. The other build comes as an xz-compressed, stripped `flash-attn` binary
# in .device-pack/ (built on the CPU machine from the older commit).
# usage: ab-bench.sh A_BINARY B_BINARY ROUNDS [flash-attn bench options, e.g. --shapes anchors --pass forward]
# Writes $OUT/ab-<build>-<round>/ (the bundles) and $OUT/ab-table.md.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-reports/bench}
a=$1 b=$2 rounds=$3
shift 3
for r in $(seq 1 "$rounds"); do
  for side in a b; do
    bin=$a; [ $side = b ] && bin=$b
    "$bin" bench "$@" --out "$out/ab-$side-$r" > "$out/ab-$side-$r.log" 2>&1 || echo "ab-bench: $side round $r exited $?"
  done
done
python3 - "$out" "$rounds" <<'PY' | tee "$out/ab-table.md"
import glob, json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def cases(side):
    got = {}
    for r in range(1, rounds + 1):
        for path in glob.glob(f"{out}/ab-{side}-{r}/*.json"):
            for c in json.load(open(path))["cases"]:
                s = c["shape"]
                key = (s["B"], s["H_q"], s["N_q"], s["d"], c["causal"], c["pass"])
                got.setdefault(key, []).append(c["median_ms"])
    return got
a, b = cases("a"), cases("b")
print("| B | H | N | d | causal | pass | A ms (each round) | B ms (each round) | B / A |")
print("|---|---|---|---|---|---|---|---|---|")
for key in sorted(a):
    if key in b:
        ma, mb = statistics.median(a[key]), statistics.median(b[key])
        fmt = lambda xs: " ".join(f"{x:.3f}" for x in xs)
        print(f"| {' | '.join(map(str, key))} | {fmt(a[key])} | {fmt(b[key])} | {mb / ma:.3f} |")
PY
