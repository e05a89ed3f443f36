"""One call of a peer under the CUDA profiler range (cudaProfilerStart/Stop), after warm-up: with
`ncu --profile-from-start off`, that call's kernels and nothing else are profiled.
scripts/peers/profile_pass.py and profile_decode.py use it."""
import torch


def profile_one_call(call, warmup=10):
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
