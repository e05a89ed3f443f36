"""One PyTorch SDPA forward, or one backward (autograd.grad of the forward output), of one shape
under the CUDA profiler range (cudaProfilerStart/Stop), after warm-up, for `ncu
--profile-from-start off`: the peer's kernels of that call and nothing else, on its own
contiguous [B, H, N, d] layout (`profiler_range`). scripts/profile-pass.sh runs it.
usage: profile_pass.py B H N D CAUSAL(0|1) BACKEND(flash|cudnn) PASS(forward|backward)
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from profiler_range import profile_one_call
from sdpa_bench import BACKENDS


def main():
    B, H, N, d, causal = (int(x) for x in sys.argv[1:6])
    backend, pass_ = sys.argv[6], sys.argv[7]
    if pass_ not in ("forward", "backward"):
        sys.exit(f"profile_pass.py: PASS is forward or backward, not {pass_!r}")
    gen = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16, generator=gen)
               .requires_grad_(pass_ == "backward") for _ in range(3))
    with sdpa_kernel(BACKENDS[backend]):
        forward = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
        if pass_ == "forward":
            call = forward
        else:
            o = forward()
            do = torch.randn_like(o)
            call = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
        profile_one_call(call)


if __name__ == "__main__":
    sys.exit(main())
