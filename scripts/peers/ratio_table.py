"""Prints the side-by-side table of one run: our TFLOP/s (from `flash-attn bench` bundles) against
PyTorch SDPA's flash and cuDNN backends (from sdpa_bench.py), forward and backward, with ratios.

usage: ratio_table.py SDPA_JSON BUNDLE_JSON [BUNDLE_JSON ...] > table.md
"""
import json, sys


def key(B, H, N, d, causal):
    return (B, H, N, d, bool(causal))


def main():
    sdpa = json.load(open(sys.argv[1]))
    peers = {}
    for r in sdpa["rows"]:
        if "error" not in r:
            peers[(key(r["B"], r["H"], r["N"], r["d"], r["causal"]), r["backend"])] = r
    ours = {}
    env = None
    for path in sys.argv[2:]:
        bundle = json.load(open(path))
        env = bundle["environment"]
        for c in bundle["cases"]:
            s = c["shape"]
            ours[(key(s["B"], s["H_q"], s["N_q"], s["d"], c["causal"]), c["pass"])] = c
    print(f"# Ours vs PyTorch SDPA, bf16, TFLOP/s (median of event-timed samples, same run)\n")
    print(f"ours: {env}; peers: {sdpa['environment']}\n")
    print("| B | H | N | d | causal | ours fwd | flash fwd | cudnn fwd | fwd/flash | fwd/cudnn | ours bwd | flash bwd | cudnn bwd | bwd/flash | bwd/cudnn |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    shapes = sorted({k[0] for k in ours}, key=lambda k: (k[3], k[2], k[4], k[0], k[1]))
    fmt = lambda x: "-" if x is None else f"{x:.0f}"
    ratio = lambda a, b: "-" if a is None or b is None else f"{a / b:.2f}"
    for k in shapes:
        of = ours.get((k, "forward")); ob = ours.get((k, "backward"))
        of = of and of["tflops"]; ob = ob and ob["tflops"]
        ff = peers.get((k, "flash")); cf = peers.get((k, "cudnn"))
        row = [of, ff and ff["fwd_tflops"], cf and cf["fwd_tflops"]]
        brow = [ob, ff and ff["bwd_tflops"], cf and cf["bwd_tflops"]]
        B, H, N, d, causal = k
        print(f"| {B} | {H} | {N} | {d} | {causal} | {fmt(row[0])} | {fmt(row[1])} | {fmt(row[2])} | {ratio(row[0], row[1])} | {ratio(row[0], row[2])} "
              f"| {fmt(brow[0])} | {fmt(brow[1])} | {fmt(brow[2])} | {ratio(brow[0], brow[1])} | {ratio(brow[0], brow[2])} |")


if __name__ == "__main__":
    main()
