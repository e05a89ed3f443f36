# Emulates the tensor-core backward's numerics (16-bit operands, P and dS rounded to the dtype, f32
# accumulation, D from the rounded O), not its layout, against an f64 reference, on the shapes of
# the tensor-core backward: sizes the relative-error bounds of tests/gpu_matrix.rs. Needs numpy.
import numpy as np
rng = np.random.default_rng(1)
def bf16(x):
    x = np.asarray(x, np.float32); b = x.view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32)
def f16(x): return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)
def run(rnd, nq, nk, d, causal):
    q = rnd(rng.uniform(-2, 2, (nq, d))); k = rnd(rng.uniform(-2, 2, (nk, d)))
    v = rnd(rng.uniform(-1, 1, (nk, d))); do = rnd(rng.uniform(-1, 1, (nq, d)))
    sc = 1 / np.sqrt(d)
    mask = np.ones((nq, nk), bool)
    if causal:
        for i in range(nq):
            mask[i, max(0, min(nk, i + 1 + nk - nq)):] = False
    # reference f64
    s = sc * (q.astype(np.float64) @ k.T.astype(np.float64)); s[~mask] = -np.inf
    m = s.max(1, keepdims=True); m[~np.isfinite(m)] = 0
    e = np.exp(s - m); l = e.sum(1, keepdims=True); p = np.where(l > 0, e / np.where(l > 0, l, 1), 0)
    lse = np.where(l[:, 0] > 0, m[:, 0] + np.log(np.where(l[:, 0] > 0, l[:, 0], 1)), -np.inf)
    o = p @ v; dp = do @ v.T; D = (do * o).sum(1, keepdims=True); ds = p * (dp - D)
    ref = dict(dq=sc * ds @ k, dk=sc * ds.T @ q, dv=p.T @ do)
    # kernel numerics: f32 scores, exp2 with LSE·log2e, P rounded, D from rounded O, dS rounded
    s32 = (q @ k.T).astype(np.float32)
    lse2 = np.where(np.isfinite(lse), lse * np.log2(np.e), np.inf).astype(np.float32)
    P = np.exp2(s32 * np.float32(sc * np.log2(np.e)) - lse2[:, None]).astype(np.float32); P[~mask] = 0
    Pr = rnd(P)
    O = rnd(o.astype(np.float32)); D32 = (do * O).sum(1, keepdims=True, dtype=np.float32)
    dP32 = (do @ v.T).astype(np.float32); dS = rnd(Pr * (dP32 - D32))
    got = dict(dq=rnd(np.float32(sc) * (dS @ k)), dk=rnd(np.float32(sc) * (dS.T @ q)), dv=rnd(Pr.T @ do))
    return {n: np.linalg.norm(got[n] - ref[n]) / max(np.linalg.norm(ref[n]), 1e-300) for n in ref}
for name, rnd in [("bf16", bf16), ("f16", f16)]:
    worst = {}
    for (nq, nk) in [(17, 17), (97, 97), (128, 128), (257, 257), (77, 300), (300, 77), (64, 256)]:
        for d in [64, 128]:
            for causal in [False, True]:
                for rep in range(2):
                    e = run(rnd, nq, nk, d, causal)
                    for kk, vv in e.items():
                        worst[kk] = max(worst.get(kk, 0), vv)
    print(name, {k: f"{v:.2e}" for k, v in worst.items()})
