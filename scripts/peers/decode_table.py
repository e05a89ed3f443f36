"""The decode table of issue 11 from one run: ours (decode-bench.json from examples/decode_bench.rs)
beside PyTorch SDPA flash and cuDNN (sdpa-decode.json from decode_bench.py), median per-call ms,
ours/cuDNN (each peer at the faster of its layouts), the K/V bandwidth each reached, and ours as
a share of the fastest copy measured in the same run (sdpa-decode.json's `copies`).
usage: decode_table.py OUT_DIR
"""
import json, os, sys


def main():
    out = sys.argv[1]
    ours = json.load(open(os.path.join(out, "decode-bench.json")))["rows"]
    sdpa = json.load(open(os.path.join(out, "sdpa-decode.json")))
    peers = sdpa["rows"]
    copy_bw = max((c["tb_per_s"] for c in sdpa.get("copies", [])), default=None)
    if copy_bw:
        for c in sdpa["copies"]:
            print(f"copy of {c['bytes'] / 1e6:.0f} MB: {c['median_ms']:.4f} ms, {c['tb_per_s']:.2f} TB/s read + written")
        print()
    key = lambda r: (r["B"], r["N_q"], r["N_k"], r["H_q"], r["H_kv"])
    # Each peer at its faster layout (rows without a layout are ours viewed strided).
    peer = {}
    for r in peers:
        at = peer.get((key(r), r["backend"]))
        if at is None or ("median_ms" in r and r["median_ms"] < at.get("median_ms", float("inf"))):
            peer[(key(r), r["backend"])] = r
    print("Peers at their faster layout: `bnhd` ours viewed strided, `bhnd` contiguous.\n")
    print("| B | N_q | N_k | H_q / H_kv | ours ms | ours TB/s | ours / copy | kernel | flash ms | cuDNN ms | cuDNN TB/s | ours / cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in ours:
        f, c = peer.get((key(r), "flash"), {}), peer.get((key(r), "cudnn"), {})
        ms = lambda x: (f"{x['median_ms']:.4f} ({x.get('layout', 'bnhd')})" if "median_ms" in x
                        else x.get("error", "-")[:30])
        ratio = f"{r['median_ms'] / c['median_ms']:.2f}" if "median_ms" in c else "-"
        c_bw = f"{c['kv_tb_per_s']:.2f}" if "kv_tb_per_s" in c else "-"
        share = f"{100 * r['kv_tb_per_s'] / copy_bw:.0f}%" if copy_bw else "-"
        print(f"| {r['B']} | {r['N_q']} | {r['N_k']} | {r['H_q']} / {r['H_kv']} | {r['median_ms']:.4f} | "
              f"{r['kv_tb_per_s']:.2f} | {share} | {r['kernel']} | {ms(f)} | {ms(c)} | {c_bw} | {ratio} |")


if __name__ == "__main__":
    sys.exit(main())
