"""The memory claim as a table (markdown, stdout) and a plot (PNG): device memory a call needs
beyond its inputs, as N grows, for our kernels (`flash-attn memory`), the materialized baseline,
and PyTorch SDPA's flash and math backends (`sdpa_bench.py --memory`), same GPU, same run.

usage: memory_plot.py OURS_JSON SDPA_MEMORY_JSON OUT_PNG > table.md
"""
import json, sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

MIB = 1 << 20


def main():
    ours = json.load(open(sys.argv[1]))
    sdpa = json.load(open(sys.argv[2]))
    peers = {(r["N"], r["backend"]): r for r in sdpa["rows"]}
    # Our families as `flash-attn memory --kernel ...` measured them, in the order they appear.
    families = []
    for r in ours["rows"]:
        for f in r["families"]:
            if f["family"] not in families:
                families.append(f["family"])
    series = {"materialized forward (ours, S and P in HBM)": []}
    for fam in families:
        series[f"{fam} forward (ours)"] = []
        series[f"{fam} backward (ours)"] = []
    series.update({
        "PyTorch math forward": [],
        "PyTorch math forward+backward": [],
        "PyTorch flash forward+backward": [],
    })
    ns = [r["N"] for r in ours["rows"]]
    print(f"# Device memory beyond the inputs, B=1, H={ours['rows'][0]['H']}, d={ours['rows'][0]['d']}, bf16 (MiB)\n")
    print(f"ours: {ours['environment']}; PyTorch: {sdpa['environment']}\n")
    print("| N | " + " | ".join(series) + " |")
    print("|---|" + "---|" * len(series))
    for r in ours["rows"]:
        n = r["N"]
        math = peers.get((n, "math"), {})
        flash = peers.get((n, "flash"), {})
        by_family = {f["family"]: f for f in r["families"]}
        values = [r["materialized_forward"]]
        for fam in families:
            f = by_family.get(fam, {})
            values += [f.get("forward"), f.get("backward")]
        values += [math.get("fwd_peak_bytes"), math.get("fwd_bwd_peak_bytes"), flash.get("fwd_bwd_peak_bytes")]
        for (name, pts), v in zip(series.items(), values):
            pts.append(None if v is None else v / MIB)
        print(f"| {n} | " + " | ".join("-" if v is None else f"{v / MIB:.1f}" for v in values) + " |")
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, pts in series.items():
        xs = [n for n, p in zip(ns, pts) if p is not None]
        ys = [p for p in pts if p is not None]
        if xs:
            ax.plot(xs, ys, marker="o", label=name)
    ax.set_xscale("log", base=2); ax.set_yscale("log")
    ax.set_xlabel("sequence length N"); ax.set_ylabel("MiB beyond the inputs")
    ax.set_title(f"Attention memory on {ours['environment']['gpu']}, bf16")
    ax.grid(True, which="both", alpha=0.3); ax.legend(fontsize=8)
    fig.tight_layout(); fig.savefig(sys.argv[3], dpi=120)


if __name__ == "__main__":
    main()
