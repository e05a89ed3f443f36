"""PyTorch SDPA peers, timed the same way as `flash-attn bench`, on the same shapes, in the same run.

Writes $OUT/sdpa.json (or ./sdpa.json): per shape and backend, the raw CUDA-event samples of the
forward and of the backward (autograd.grad of the forward output), their medians and TFLOP/s with
the anchors' FLOP count (4*B*H*N^2*d, halved when causal; backward 2.5x forward).
With --memory: peak allocated bytes of forward and of forward+backward per backend as N grows.
"""
import argparse, json, os, sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def anchor_cases():
    cases = []
    for d in (64, 128):
        for n in (512, 1024, 2048, 4096, 8192, 16384):
            for causal in (False, True):
                cases.append((max(1, 16384 // n), 2048 // d, n, d, causal))
    cases.append((1, 32, 4096, 128, False))
    return cases


def timed(fn, warmup, samples):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(samples):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize()
        out.append(s.elapsed_time(e))
    return out


def median(xs):
    s = sorted(xs); n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def bench(args):
    rows = []
    for (B, H, N, d, causal) in anchor_cases():
        # Layout [B, N, H, d] like ours, viewed as [B, H, N, d] for SDPA.
        q = torch.randn(B, N, H, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
        k = torch.randn_like(q).requires_grad_(); v = torch.randn_like(q).requires_grad_()
        do = torch.randn_like(q)
        flops = 4 * B * H * N * N * d / (2 if causal else 1)
        for name in args.backends:
            try:
                with sdpa_kernel(BACKENDS[name]):
                    fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), args.warmup, args.samples)
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    bwd = timed(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), args.warmup, args.samples)
            except Exception as ex:  # a backend that refuses a shape is recorded, not hidden
                rows.append(dict(B=B, H=H, N=N, d=d, causal=causal, backend=name, error=str(ex).splitlines()[0][:200]))
                continue
            row = dict(B=B, H=H, N=N, d=d, causal=causal, backend=name, warmup=args.warmup,
                       fwd_samples_ms=fwd, bwd_samples_ms=bwd, fwd_ms=median(fwd), bwd_ms=median(bwd),
                       fwd_tflops=flops / median(fwd) / 1e9, bwd_tflops=2.5 * flops / median(bwd) / 1e9)
            rows.append(row)
            print(f"B={B} H={H} N={N} d={d} causal={causal} {name:6s} fwd {row['fwd_tflops']:6.1f} bwd {row['bwd_tflops']:6.1f} TFLOP/s", flush=True)
        del q, k, v, do
    return rows


def memory(args):
    rows = []
    for N in args.memory_n:
        B, H, d = 1, 16, 128
        for name in ("flash", "math"):
            q = torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn_like(q, requires_grad=True); v = torch.randn_like(q, requires_grad=True)
            do = torch.randn_like(q)
            torch.cuda.synchronize(); base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            try:
                with sdpa_kernel(BACKENDS[name]):
                    o = F.scaled_dot_product_attention(q, k, v)
                    torch.cuda.synchronize(); fwd_peak = torch.cuda.max_memory_allocated() - base
                    torch.autograd.grad(o, (q, k, v), do)
                    torch.cuda.synchronize(); bwd_peak = torch.cuda.max_memory_allocated() - base
                rows.append(dict(B=B, H=H, N=N, d=d, backend=name, fwd_peak_bytes=fwd_peak, fwd_bwd_peak_bytes=bwd_peak))
            except torch.OutOfMemoryError as ex:
                rows.append(dict(B=B, H=H, N=N, d=d, backend=name, error="out of memory"))
            print(rows[-1], flush=True)
            del q, k, v, do
            torch.cuda.empty_cache()
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--backends", nargs="+", default=["flash", "cudnn"], choices=sorted(BACKENDS))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--samples", type=int, default=30)
    p.add_argument("--memory", action="store_true", help="measure peak memory instead of time")
    p.add_argument("--memory-n", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    args = p.parse_args()
    env = dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda)
    print(env, flush=True)
    result = dict(environment=env, rows=memory(args) if args.memory else bench(args))
    name = "sdpa_memory.json" if args.memory else "sdpa.json"
    with open(os.path.join(os.environ.get("OUT", "."), name), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
