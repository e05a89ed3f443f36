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
    series = {
        "materialized forward (ours, S and P in HBM)": [],
        "exact forward (ours)": [],
        "exact backward (ours)": [],
        "tensor-core forward (ours)": [],
        "tensor-core backward (ours)": [],
        "PyTorch math forward": [],
        "PyTorch math forward+backward": [],
        "PyTorch flash forward+backward": [],
    }
    ns = [r["N"] for r in ours["rows"]]
    print(f"# Device memory beyond the inputs, B=1, H={ours['rows'][0]['H']}, d={ours['rows'][0]['d']}, bf16 (MiB)\n")
    print(f"ours: {ours['environment']}; PyTorch: {sdpa['environment']}\n")
    print("| N | " + " | ".join(series) + " |")
    print("|---|" + "---|" * len(series))
    for r in ours["rows"]:
        n = r["N"]
        math = peers.get((n, "math"), {})
        flash = peers.get((n, "flash"), {})
        values = [r["materialized_forward"], r["exact_forward"], r["exact_backward"], r.get("tensor_core_forward"),
                  r.get("tensor_core_backward"),
                  math.get("fwd_peak_bytes"), math.get("fwd_bwd_peak_bytes"), flash.get("fwd_bwd_peak_bytes")]
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
