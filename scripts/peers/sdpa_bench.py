"""PyTorch SDPA peers, timed the same way as `flash-attn bench`, on the same shapes, in the same run.

Writes $OUT/sdpa.json (or ./sdpa.json): per shape, backend, layout and repeat, the raw CUDA-event
samples of the forward and of the backward (autograd.grad of the forward output), their medians
and TFLOP/s with the anchors' FLOP count (4*B*H*N^2*d, halved when causal; backward 2.5x forward).

Timing (`--timing pipelined`, the default, as `flash-attn bench`): after warm-up, each sample is
many calls queued back to back between two events (enough for about 2 ms, at most 200), divided
by the count, so PyTorch's per-call host overhead overlaps the kernels as in a training loop.
`--timing synced`: one call per event pair, waited on.
Layouts: `bnhd` is ours, [B, N, H, d] viewed as [B, H, N, d] (strided); `bhnd` is contiguous
[B, H, N, d], SDPA's own. `--repeats 2` measures everything twice (whole passes, one after the
other) so the run-to-run spread can be stated.
With --memory: peak allocated bytes of forward and of forward+backward per backend as N grows.
"""
import argparse, json, math, os, sys

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


def headdim_cases():
    """`flash-attn bench --shapes headdims`: N = 4096, B = 4, H = 2048/d rounded, causal and not."""
    cases = []
    for d in (32, 80, 96, 160, 192, 256):
        for causal in (False, True):
            cases.append((4, (2048 + d // 2) // d, 4096, d, causal))
    return cases


SHAPES = {"anchors": anchor_cases, "headdims": headdim_cases}


def timed(fn, warmup, samples, timing, calls):
    """Per-call milliseconds of `samples` samples and the calls each sample made."""
    def batch(n):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            fn()
        e.record(); e.synchronize()
        return s.elapsed_time(e) / n
    torch.cuda.synchronize()
    warm = batch(max(warmup, 1))
    if timing == "synced":
        calls = 1
    elif calls == 0:
        calls = min(200, max(1, math.ceil(2.0 / max(warm, 1e-3))))
    return [batch(calls) for _ in range(samples)], calls


def median(xs):
    s = sorted(xs); n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def tensors(B, H, N, d, layout):
    if layout == "bnhd":  # ours, viewed as [B, H, N, d]
        make = lambda: torch.randn(B, N, H, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    else:
        make = lambda: torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16)
    q, k, v = (make().requires_grad_() for _ in range(3))
    return q, k, v, make()


def bench(args):
    rows = []
    for rep in range(args.repeats):
        for (B, H, N, d, causal) in SHAPES[args.shapes]():
            flops = 4 * B * H * N * N * d / (2 if causal else 1)
            for layout in args.layouts:
                q, k, v, do = tensors(B, H, N, d, layout)
                for name in args.backends:
                    base = dict(B=B, H=H, N=N, d=d, causal=causal, backend=name, layout=layout, rep=rep)
                    try:
                        with sdpa_kernel(BACKENDS[name]):
                            sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            fwd, fcalls = timed(sdpa, args.warmup, args.samples, args.timing, args.calls)
                            o = sdpa()
                            grad = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
                            bwd, bcalls = timed(grad, args.warmup, args.samples, args.timing, args.calls)
                    except Exception as ex:  # a backend that refuses a shape is recorded, not hidden
                        rows.append(dict(base, error=str(ex).splitlines()[0][:200]))
                        continue
                    row = dict(base, warmup=args.warmup, timing=args.timing,
                               fwd_calls_per_sample=fcalls, bwd_calls_per_sample=bcalls,
                               fwd_samples_ms=fwd, bwd_samples_ms=bwd, fwd_ms=median(fwd), bwd_ms=median(bwd),
                               fwd_tflops=flops / median(fwd) / 1e9, bwd_tflops=2.5 * flops / median(bwd) / 1e9)
                    rows.append(row)
                    print(f"rep {rep} B={B} H={H} N={N} d={d} causal={causal} {name:6s} {layout} "
                          f"fwd {row['fwd_tflops']:6.1f} bwd {row['bwd_tflops']:6.1f} TFLOP/s", flush=True)
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
    p.add_argument("--timing", choices=["pipelined", "synced"], default="pipelined")
    p.add_argument("--calls", type=int, default=0, help="calls per pipelined sample (0: about 2 ms worth)")
    p.add_argument("--layouts", nargs="+", default=["bnhd", "bhnd"], choices=["bnhd", "bhnd"])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--shapes", choices=sorted(SHAPES), default="anchors",
                   help="the shape set, as `flash-attn bench --shapes`")
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
