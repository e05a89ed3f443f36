"""Prints the side-by-side table of one run: our times (from `flash-attn bench` bundles) against
PyTorch SDPA's flash and cuDNN backends (from sdpa_bench.py), forward and backward.

Each peer is held at its best: the faster of its layouts (ours viewed strided, or contiguous) and
of its repeats. A ratio is peer time / our time: above 1, ours is faster. The peers' run-to-run
spread (the same backend, layout and shape measured in two passes of one run) is stated above the
table.

usage: ratio_table.py SDPA_JSON BUNDLE_JSON [BUNDLE_JSON ...] > table.md
"""
import json, statistics, sys


def key(B, H, N, d, causal):
    return (B, H, N, d, bool(causal))


def peer_best(sdpa):
    """(shape, backend) -> (fwd_ms, fwd_layout, bwd_ms, bwd_layout), and the spreads."""
    best, by_rep = {}, {}
    for r in sdpa["rows"]:
        if "error" in r:
            continue
        k = (key(r["B"], r["H"], r["N"], r["d"], r["causal"]), r["backend"])
        b = best.setdefault(k, [float("inf"), None, float("inf"), None])
        if r["fwd_ms"] < b[0]:
            b[0], b[1] = r["fwd_ms"], r["layout"]
        if r["bwd_ms"] < b[2]:
            b[2], b[3] = r["bwd_ms"], r["layout"]
        by_rep.setdefault((k, r["layout"]), []).append((r["fwd_ms"], r["bwd_ms"]))
    spreads = [abs(a - b) / min(a, b)
               for reps in by_rep.values() if len(reps) > 1
               for a, b in zip(*reps[:2])]
    return best, spreads


def main():
    sdpa = json.load(open(sys.argv[1]))
    best, spreads = peer_best(sdpa)
    ours, env, timing = {}, None, set()
    for path in sys.argv[2:]:
        bundle = json.load(open(path))
        env = bundle["environment"]
        for c in bundle["cases"]:
            s = c["shape"]
            ours[(key(s["B"], s["H_q"], s["N_q"], s["d"], c["causal"]), c["pass"])] = c
            timing.add(c.get("timing", "synced"))
    peer_timing = {r.get("timing", "synced") for r in sdpa["rows"] if "error" not in r}
    print("# Ours vs PyTorch SDPA, bf16: median ms per call, same run\n")
    print(f"ours: {env}; timing {sorted(timing)}\n")
    print(f"peers: {sdpa['environment']}; timing {sorted(peer_timing)}; each peer at its faster layout "
          f"(bnhd: ours viewed strided, bhnd: contiguous) and repeat\n")
    if spreads:
        print(f"peers' run-to-run spread (two passes, same backend/layout/shape): median "
              f"{100 * statistics.median(spreads):.1f}%, max {100 * max(spreads):.1f}% over {len(spreads)} pairs\n")
    print("ratio = peer time / our time (above 1: ours faster)\n")
    print("| B | H | N | d | causal | ours fwd | flash fwd | cuDNN fwd | ×flash | ×cuDNN | ours bwd | flash bwd | cuDNN bwd | ×flash | ×cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    shapes = sorted({k[0] for k in ours}, key=lambda k: (k[3], k[2], k[4], k[0], k[1]))
    ms = lambda x: "-" if x is None else f"{x:.3f}"
    ratio = lambda peer, us: "-" if peer is None or us is None else f"{peer / us:.2f}"
    worst = {}
    for k in shapes:
        of, ob = ours.get((k, "forward")), ours.get((k, "backward"))
        of, ob = of and of["median_ms"], ob and ob["median_ms"]
        fl, cu = best.get((k, "flash")), best.get((k, "cudnn"))
        ff, fb = (fl[0], fl[2]) if fl else (None, None)
        cf, cb = (cu[0], cu[2]) if cu else (None, None)
        for name, peer, us in (("fwd/flash", ff, of), ("fwd/cudnn", cf, of), ("bwd/flash", fb, ob), ("bwd/cudnn", cb, ob)):
            if peer is not None and us is not None:
                worst[name] = min(worst.get(name, float("inf")), peer / us)
        B, H, N, d, causal = k
        print(f"| {B} | {H} | {N} | {d} | {causal} | {ms(of)} | {ms(ff)} | {ms(cf)} | {ratio(ff, of)} | {ratio(cf, of)} "
              f"| {ms(ob)} | {ms(fb)} | {ms(cb)} | {ratio(fb, ob)} | {ratio(cb, ob)} |")
    print("\nlowest ratio per column: " + ", ".join(f"{n} {v:.2f}" for n, v in sorted(worst.items())))


if __name__ == "__main__":
    main()
