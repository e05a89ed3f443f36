"""One PyTorch SDPA call of a decode row of scripts/peers/decode_bench.py under the CUDA profiler
range, after warm-up (`profiler_range`), for `ncu --profile-from-start off`: the peer's
kernels of that call and nothing else. scripts/profile-decode.sh runs it.
usage: profile_decode.py ROW BACKEND   (ROW 1 is the first of ROWS; BACKEND flash or cudnn)
"""
import sys

import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from decode_bench import ROWS, inputs
from profiler_range import profile_one_call
from sdpa_bench import BACKENDS


def main():
    row, backend = int(sys.argv[1]), sys.argv[2]
    B, nq, nk, hq, hkv = ROWS[row - 1]
    q, k, v = inputs(B, nq, nk, hq, hkv)
    with sdpa_kernel(BACKENDS[backend]):
        call = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=hkv != hq)
        profile_one_call(call)


if __name__ == "__main__":
    sys.exit(main())
