"""Cross-checks `flash-attn forward` / `backward` from outside: numpy writes Q, K, V, dO as .npy
([batch, seq, heads, head_dim]), the CLI computes O, LSE, dQ, dK, dV, and PyTorch recomputes them
in float64 with autograd (GQA, bottom-right causal mask, N_q != N_k). Prints the relative errors
and exits non-zero when one is over its bound.

usage: npy_crosscheck.py FLASH_ATTN_BINARY WORK_DIR
"""
import os, subprocess, sys

import numpy as np
import torch

B, NQ, NK, HQ, HKV, D = 2, 77, 100, 4, 2, 64
# f32 files compute in f32 (bound far below 1e-4); f16 files compute in f16 storage.
CASES = [("f32", np.float32, 1e-4), ("f16", np.float16, 5e-3)]


def reference(q, k, v, do):
    q, k, v = (torch.tensor(x.astype(np.float64), requires_grad=True) for x in (q, k, v))
    group = HQ // HKV
    kk = k.repeat_interleave(group, dim=2)
    vv = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, kk) / D ** 0.5
    i = torch.arange(NQ)[:, None]; j = torch.arange(NK)[None, :]
    s = s.masked_fill(j > i + NK - NQ, float("-inf"))  # bottom-right aligned causal mask
    lse = torch.logsumexp(s, dim=-1)
    o = torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1), vv)
    o.backward(torch.tensor(do.astype(np.float64)))
    return o.detach().numpy(), lse.detach().numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()


def rel(got, want):
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


def main():
    binary, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng()
    failed = False
    for name, dtype, bound in CASES:
        x = {n: rng.uniform(-1, 1, shape).astype(dtype) for n, shape in
             [("q", (B, NQ, HQ, D)), ("k", (B, NK, HKV, D)), ("v", (B, NK, HKV, D)), ("do", (B, NQ, HQ, D))]}
        path = {n: os.path.join(work, f"{name}_{n}.npy") for n in ["q", "k", "v", "do", "o", "lse", "dq", "dk", "dv"]}
        for n in ["q", "k", "v", "do"]:
            np.save(path[n], x[n])
        common = ["--q", path["q"], "--k", path["k"], "--v", path["v"], "--causal"]
        subprocess.run([binary, "forward", *common, "--out", path["o"], "--lse", path["lse"]], check=True)
        subprocess.run([binary, "backward", *common, "--do", path["do"], "--o", path["o"], "--lse", path["lse"],
                        "--dq", path["dq"], "--dk", path["dk"], "--dv", path["dv"]], check=True)
        want = reference(x["q"], x["k"], x["v"], x["do"])
        got = [np.load(path[n]) for n in ["o", "lse", "dq", "dk", "dv"]]
        errors = {n: rel(g, w) for n, g, w in zip(["O", "LSE", "dQ", "dK", "dV"], got, want)}
        print(f"{name} files, B={B} N_q={NQ} N_k={NK} H_q={HQ} H_kv={HKV} d={D} causal:",
              ", ".join(f"{n} {e:.2e}" for n, e in errors.items()), f"(bound {bound:.0e})")
        failed |= any(e > bound for e in errors.values())
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
