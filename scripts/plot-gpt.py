#!/usr/bin/env python3
"""Plots the JSON of crates/candle-gpt's `gpt` (`--attention both --out gpt.json`): every
run's loss curve (top) and the differences flash - candle and candle - candle-f32 (bottom, the
second being the bf16 noise the example checks against), into a PNG; prints the max and mean
|Δloss| over the last N steps (default the example's --check-last) and the timing table.

    python3 scripts/plot-gpt.py gpt.json -o gpt.png [--last N]
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json")
    ap.add_argument("-o", "--output", default="gpt.png")
    ap.add_argument("--last", type=int, help="steps at the end to compare (default: check_last)")
    a = ap.parse_args()
    with open(a.json) as f:
        data = json.load(f)
    config = data["config"]
    runs = {r["attention"]: r for r in data["runs"]}
    last = a.last or config["check_last"]

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True,
                                      gridspec_kw={"height_ratios": [2, 1]})
    for name, run in runs.items():
        top.plot(run["loss"], label=name, linewidth=1)
    top.set_ylabel("loss (nats/byte)")
    top.set_title(f"GPT {config['layers']}x{config['d_model']}, {config['heads']} heads, "
                  f"context {config['seq']}, batch {config['batch']}, seed {config['seed']} "
                  f"({data['device']})")
    top.legend()
    top.grid(alpha=0.3)

    pairs = [("flash", "candle"), ("candle", "candle-f32")]
    status = 0
    for x, y in pairs:
        if x not in runs or y not in runs:
            continue
        lx, ly = runs[x]["loss"], runs[y]["loss"]
        if any(v is None for v in lx + ly):
            print(f"{x} or {y}: a loss is not finite")
            status = 1
            continue
        d = [p - q for p, q in zip(lx, ly)]
        bottom.plot(d, label=f"{x} - {y}", linewidth=1)
        tail = [abs(v) for v in d[-last:]]
        print(f"|loss_{x} - loss_{y}| over the last {last} steps: "
              f"max {max(tail):.3g}, mean {sum(tail) / len(tail):.3g}")
    bottom.axvspan(config["steps"] - last, config["steps"], color="grey", alpha=0.15,
                   label=f"last {last} steps")
    bottom.axhline(0, color="black", linewidth=0.5)
    bottom.set_xlabel("step")
    bottom.set_ylabel("Δloss")
    bottom.legend()
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.output, dpi=120)
    print(f"wrote {a.output}")

    print(f"{'attention':11} {'median ms':>10} {'tokens/s':>10} {'peak MiB':>9}")
    for name, run in runs.items():
        peak = run["peak_bytes"]
        peak = f"{peak / 2**20:.1f}" if peak is not None else "n/a"
        print(f"{name:11} {run['median_step_ms']:10.2f} {run['tokens_per_s']:10.0f} {peak:>9}")
    if "check" in data:
        c = data["check"]
        num = lambda v: "n/a" if v is None else f"{v:.3g}"  # noqa: E731
        print(f"example's check: mean |flash - candle| {num(c['mean_abs_diff_flash_candle'])} vs "
              f"bf16 noise {num(c['mean_abs_diff_candle_f32'])}: "
              f"{'passed' if c['passed'] else 'FAILED'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
