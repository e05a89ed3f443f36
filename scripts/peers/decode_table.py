"""The decode table of issue 11 from one run: ours (decode-bench.json from examples/decode_bench.rs)
beside PyTorch SDPA flash and cuDNN (sdpa-decode.json from decode_bench.py), median per-call ms,
ours/cuDNN, and the K/V bandwidth each reached.
usage: decode_table.py OUT_DIR
"""
import json, os, sys


def main():
    out = sys.argv[1]
    ours = json.load(open(os.path.join(out, "decode-bench.json")))["rows"]
    peers = json.load(open(os.path.join(out, "sdpa-decode.json")))["rows"]
    key = lambda r: (r["B"], r["N_q"], r["N_k"], r["H_q"], r["H_kv"])
    peer = {(key(r), r["backend"]): r for r in peers}
    print("| B | N_q | N_k | H_q / H_kv | ours ms | ours TB/s | kernel | flash ms | cuDNN ms | cuDNN TB/s | ours / cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in ours:
        f, c = peer.get((key(r), "flash"), {}), peer.get((key(r), "cudnn"), {})
        ms = lambda x: f"{x['median_ms']:.4f}" if "median_ms" in x else x.get("error", "-")[:30]
        ratio = f"{r['median_ms'] / c['median_ms']:.2f}" if "median_ms" in c else "-"
        c_bw = f"{c['kv_tb_per_s']:.2f}" if "kv_tb_per_s" in c else "-"
        print(f"| {r['B']} | {r['N_q']} | {r['N_k']} | {r['H_q']} / {r['H_kv']} | {r['median_ms']:.4f} | "
              f"{r['kv_tb_per_s']:.2f} | {r['kernel']} | {ms(f)} | {ms(c)} | {c_bw} | {ratio} |")


if __name__ == "__main__":
    sys.exit(main())
