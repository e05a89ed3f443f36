"""PyTorch SDPA (flash and cuDNN) on the decode rows of examples/decode_bench.rs, timed the same way
in the same run: after warm-up, each sample is --calls back-to-back calls between two CUDA events.
bf16, d = 128, GQA through enable_gqa, in our layout viewed strided and in the peers' contiguous
one (`LAYOUTS`). Also times a device-to-device copy (`Tensor.copy_`) of each
size in COPY_BYTES, the same way: issue 11 holds the decode rows' K/V read rate against the
measured copy bandwidth (bytes read plus bytes written per second). Writes $OUT/sdpa-decode.json
(raw per-call samples) and prints the median per-call time and the bytes moved per second.
"""
import argparse, json, os, sys

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from sdpa_bench import BACKENDS, median, timed

PEERS = ("flash", "cudnn")
# Ours viewed strided, and the peers' contiguous layout: each peer is held at its faster.
LAYOUTS = ("bnhd", "bhnd")
# (B, N_q, N_k, H_q, H_kv), as ROWS in examples/decode_bench.rs.
ROWS = [(1, 1, 32768, 32, 8), (1, 1, 131072, 32, 8), (8, 1, 8192, 32, 8), (64, 1, 4096, 32, 8),
        (1, 1, 131072, 32, 32), (1, 512, 32768, 32, 8)]
# Copies: row 1's K/V bytes (134 MB) and 1 GiB.
COPY_BYTES = (2 * 32768 * 8 * 128 * 2, 1 << 30)


def inputs(B, nq, nk, hq, hkv, d=128, layout="bnhd"):
    """Fresh random Q, K, V of a row as [B, H, N, d]: `bnhd` is ours, [B, N, H, d] viewed
    (strided); `bhnd` is contiguous, the peers' own layout."""
    new = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    if layout == "bnhd":
        q, k = new(B, nq, hq, d).transpose(1, 2), new(B, nk, hkv, d).transpose(1, 2)
    else:
        q, k = new(B, hq, nq, d), new(B, hkv, nk, d)
    return q, k, torch.randn_like(k)


def copies(args):
    """The copy bandwidth of each size in COPY_BYTES: read + written bytes per second."""
    out = []
    for n in COPY_BYTES:
        src = torch.randn(n // 2, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        samples, _ = timed(lambda: dst.copy_(src), args.warmup, args.samples, "pipelined", args.calls)
        assert torch.equal(dst, src)
        ms = median(samples)
        out.append(dict(bytes=n, calls_per_sample=args.calls, warmup=args.warmup, median_ms=ms,
                        tb_per_s=2 * n / (ms * 1e-3) / 1e12, samples_ms_per_call=samples))
        print(f"copy {n / 1e6:.0f} MB: {ms:.4f} ms, {out[-1]['tb_per_s']:.2f} TB/s read + written", flush=True)
        del src, dst
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--samples", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    assert args.samples >= 20
    env = dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda)
    print(env, flush=True)
    rows = []
    for (B, nq, nk, hq, hkv) in ROWS:
        d = 128
        # Causal is bottom-right for N_q < N_k in ours, so these rows (no mask) compare like for like.
        kv_bytes = 2 * B * nk * hkv * d * 2
        for layout in LAYOUTS:
            q, k, v = inputs(B, nq, nk, hq, hkv, d, layout)
            for name in PEERS:
                base = dict(B=B, N_q=nq, N_k=nk, H_q=hq, H_kv=hkv, d=d, backend=name, layout=layout)
                try:
                    with sdpa_kernel(BACKENDS[name]):
                        sdpa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=hkv != hq)
                        samples, _ = timed(sdpa, args.warmup, args.samples, "pipelined", args.calls)
                except Exception as ex:  # a backend that refuses a row is recorded, not hidden
                    rows.append(dict(base, error=str(ex).splitlines()[0][:200]))
                    print(rows[-1], flush=True)
                    continue
                ms = median(samples)
                rows.append(dict(base, calls_per_sample=args.calls, warmup=args.warmup, median_ms=ms, kv_bytes=kv_bytes,
                                 kv_tb_per_s=kv_bytes / (ms * 1e-3) / 1e12, samples_ms_per_call=samples))
                print(f"B={B} N_q={nq} N_k={nk} H_q/H_kv={hq}/{hkv} {name:6s} {layout} {ms:.4f} ms, "
                      f"K/V {rows[-1]['kv_tb_per_s']:.2f} TB/s", flush=True)
            del q, k, v
    with open(os.path.join(os.environ.get("OUT", "."), "sdpa-decode.json"), "w") as f:
        json.dump(dict(environment=env, rows=rows, copies=copies(args)), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
