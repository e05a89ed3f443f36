//! `flash_attn` on candle CUDA tensors, forward and backward (through candle's autograd), against
//! the f64 reference for every option, and against candle's own f32 matmul/softmax attention
//! where that is easy to write (plain and causal, GQA). Skips visibly without a CUDA device.
//!
//! The loss is `Σ O ∘ W` with `W` rounded to the inputs' type, so `dO = W` reaches the backward
//! exactly. Bounds are the library's own GPU tests' (tests/gpu_matrix.rs): `rel_err` ≤ 1e-2 for
//! bf16 and 2e-3 for f16, gradients included, with the gradients' reference taken from the kernel's
//! own stored O (`backward_from_output`, as there: the rounding of O alone moves dQ and dK where
//! `dP` and `D` cancel). Candle's f32 attention is first held to 1e-5 against the f64 reference,
//! which shows it computes the same function, then ours to the dtype's bound against it.

use candle_core::{D, DType, Device, Result, Tensor, Var};
use flash_attn::candle::flash_attn;
use flash_attn::reference::{backward_from_output, forward};
use flash_attn::{AttentionOptions, AttentionShape, FlashOptions, alibi_slopes};
use flash_attn_testkit::testing::{rel_err, skip};

fn device(test: &str) -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            // candle's error carries a backtrace after its first line.
            let why = e.to_string();
            let why = why.lines().next().unwrap_or_default();
            skip(test, &format!("no CUDA device answered ({why})"));
            None
        }
    }
}

fn bound(dtype: DType) -> f64 {
    if dtype == DType::BF16 { 1e-2 } else { 2e-3 }
}

struct Case {
    name: &'static str,
    dtype: DType,
    shape: AttentionShape,
    options: AttentionOptions,
    /// Also against candle's f32 attention (plain or causal, n_q = n_k).
    candle: bool,
    /// Q given as a `[B, H, N, d]` tensor transposed to `[B, N, H, d]`: a strided view read in
    /// place.
    transposed_q: bool,
}

fn shape(batch: u32, n: u32, heads_q: u32, heads_kv: u32, head_dim: u32) -> AttentionShape {
    AttentionShape::new(batch, n, n, heads_q, heads_kv, head_dim)
}

fn cases() -> Vec<Case> {
    let plain = AttentionOptions::new();
    let case = |name, dtype, shape, options, candle, transposed_q| Case {
        name,
        dtype,
        shape,
        options,
        candle,
        transposed_q,
    };
    vec![
        case(
            "bf16 causal gqa, transposed Q",
            DType::BF16,
            shape(2, 128, 4, 2, 64),
            plain.clone().causal(true),
            true,
            true,
        ),
        case(
            "f16 plain, n=96",
            DType::F16,
            shape(1, 96, 2, 2, 128),
            plain.clone(),
            true,
            false,
        ),
        case(
            "f16 window+softcap",
            DType::F16,
            shape(1, 80, 2, 1, 64),
            plain.clone().window(32, 0).softcap(30.0),
            false,
            false,
        ),
        case(
            "bf16 alibi+sinks",
            DType::BF16,
            shape(2, 64, 4, 4, 64),
            plain
                .clone()
                .causal(true)
                .alibi_slopes(alibi_slopes(4))
                .sinks(vec![0.5, -1.0, 0.0, 2.0]),
            false,
            false,
        ),
        case(
            "bf16 dropout",
            DType::BF16,
            shape(1, 64, 2, 2, 64),
            plain.clone().dropout(0.1, 7, 0),
            false,
            true,
        ),
        case(
            "bf16 causal gqa, V of head dim 64 beside Q/K of 128",
            DType::BF16,
            shape(2, 96, 4, 2, 128).with_head_dim_v(64),
            plain.clone().causal(true),
            true,
            false,
        ),
        case(
            "bf16 key lengths",
            DType::BF16,
            shape(2, 64, 2, 2, 64),
            plain.clone().key_lengths(vec![40, 64]),
            false,
            false,
        ),
    ]
}

fn host(t: &Tensor) -> Result<Vec<f64>> {
    let v = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    Ok(v.into_iter().map(f64::from).collect())
}

fn host_f32(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

/// Candle's own attention in f32 on `[B, N, H, d]` tensors: `softmax(τ·QKᵀ + mask) · V` with K/V
/// heads repeated for GQA and the causal mask aligned as the library's (n_q = n_k here).
fn candle_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    s: &AttentionShape,
    causal: bool,
) -> Result<Tensor> {
    let group = (s.heads_q / s.heads_kv) as usize;
    let (_, n, _, d) = k.dims4()?;
    // K and V each with its own head dim.
    let repeat = |t: &Tensor| -> Result<Tensor> {
        let (b, n, hkv, dim) = t.dims4()?;
        t.transpose(1, 2)?
            .unsqueeze(2)?
            .broadcast_as((b, hkv, group, n, dim))?
            .reshape((b, hkv * group, n, dim))
    };
    let (k, v) = (repeat(k)?, repeat(v)?);
    let q = q.transpose(1, 2)?.contiguous()?;
    let tau = 1.0 / (d as f64).sqrt();
    let mut scores = (q.matmul(&k.t()?.contiguous()?)? * tau)?;
    if causal {
        let n_q = s.n_q as usize;
        let mask: Vec<f32> = (0..n_q * n)
            .map(|x| {
                if x % n > x / n {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        scores = scores.broadcast_add(&Tensor::from_vec(mask, (n_q, n), q.device())?)?;
    }
    let max = scores.max_keepdim(D::Minus1)?;
    let e = scores.broadcast_sub(&max)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    p.matmul(&v.contiguous()?)?.transpose(1, 2)?.contiguous()
}

fn check(what: &str, errs: &[(&str, f64)], bound: f64) -> bool {
    let ok = errs.iter().all(|e| e.1 <= bound);
    let errs: Vec<String> = errs
        .iter()
        .map(|(name, e)| format!("{name} {e:.2e}"))
        .collect();
    let verdict = if ok { "ok" } else { "FAIL" };
    println!("{what}: {} (bound {bound:.0e}) {verdict}", errs.join(", "));
    ok
}

#[test]
fn candle_op_matches_references() -> Result<()> {
    let Some(dev) = device("candle_op_matches_references") else {
        return Ok(());
    };
    dev.set_seed(1234)?;
    let mut failed = Vec::new();
    for case in cases() {
        let s = &case.shape;
        let (b, nq, nk, hq, hkv, d, d_v) = (
            s.batch as usize,
            s.n_q as usize,
            s.n_k as usize,
            s.heads_q as usize,
            s.heads_kv as usize,
            s.head_dim as usize,
            s.head_dim_v as usize,
        );
        let dt = case.dtype;
        let randn =
            |dims: (usize, usize, usize, usize)| Tensor::randn(0f32, 1.0, dims, &dev)?.to_dtype(dt);
        // Q is held as [B, H, N, d] when the op reads it transposed.
        let q_held = match case.transposed_q {
            true => Var::from_tensor(&randn((b, hq, nq, d))?)?,
            false => Var::from_tensor(&randn((b, nq, hq, d))?)?,
        };
        let q = match case.transposed_q {
            true => q_held.as_tensor().transpose(1, 2)?,
            false => q_held.as_tensor().clone(),
        };
        let k = Var::from_tensor(&randn((b, nk, hkv, d))?)?;
        let v = Var::from_tensor(&randn((b, nk, hkv, d_v))?)?;
        let w = randn((b, nq, hq, d_v))?.to_dtype(DType::F32)?;

        let options = FlashOptions::new(case.options.clone());
        let o = flash_attn(&q, k.as_tensor(), v.as_tensor(), &options)?;
        let grads = (o.to_dtype(DType::F32)? * &w)?.sum_all()?.backward()?;
        let grad = |t: &Tensor| grads.get(t).cloned().expect("a gradient for each input");
        let dq = match case.transposed_q {
            true => grad(q_held.as_tensor()).transpose(1, 2)?.contiguous()?,
            false => grad(q_held.as_tensor()),
        };
        let (dk, dv) = (grad(k.as_tensor()), grad(v.as_tensor()));
        let ours = [
            host_f32(&o)?,
            host_f32(&dq)?,
            host_f32(&dk)?,
            host_f32(&dv)?,
        ];

        // The f64 reference on the same (rounded) inputs.
        let (qh, kh, vh, wh) = (
            host(&q.contiguous()?)?,
            host(k.as_tensor())?,
            host(v.as_tensor())?,
            host(&w)?,
        );
        let f = forward(s, &qh, &kh, &vh, &case.options).expect("reference forward");
        let o_stored: Vec<f64> = ours[0].iter().map(|&x| f64::from(x)).collect();
        let g = backward_from_output(s, (&qh, &kh, &vh), &o_stored, &wh, &case.options)
            .expect("reference backward");
        let errs = [
            ("o", rel_err(&ours[0], &f.o)),
            ("dq", rel_err(&ours[1], &g.dq)),
            ("dk", rel_err(&ours[2], &g.dk)),
            ("dv", rel_err(&ours[3], &g.dv)),
        ];
        if !check(
            &format!("{}: vs f64 reference", case.name),
            &errs,
            bound(dt),
        ) {
            failed.push(case.name);
        }

        if case.candle {
            let f32_var = |t: &Tensor| Var::from_tensor(&t.to_dtype(DType::F32)?);
            let (qf, kf, vf) = (
                f32_var(&q.contiguous()?)?,
                f32_var(k.as_tensor())?,
                f32_var(v.as_tensor())?,
            );
            let of = candle_attention(
                qf.as_tensor(),
                kf.as_tensor(),
                vf.as_tensor(),
                s,
                case.options.causal,
            )?;
            let gf = (&of * &w)?.sum_all()?.backward()?;
            let theirs = [
                host(&of)?,
                host(gf.get(qf.as_tensor()).expect("dq"))?,
                host(gf.get(kf.as_tensor()).expect("dk"))?,
                host(gf.get(vf.as_tensor()).expect("dv"))?,
            ];
            let g64 = flash_attn::reference::backward(s, &qh, &kh, &vh, &wh, &case.options)
                .expect("reference backward");
            let narrow = |x: &[f64]| x.iter().map(|&x| x as f32).collect::<Vec<_>>();
            let candle_errs = [
                ("o", rel_err(&narrow(&theirs[0]), &f.o)),
                ("dq", rel_err(&narrow(&theirs[1]), &g64.dq)),
                ("dk", rel_err(&narrow(&theirs[2]), &g64.dk)),
                ("dv", rel_err(&narrow(&theirs[3]), &g64.dv)),
            ];
            if !check(
                &format!("{}: candle f32 vs f64 reference", case.name),
                &candle_errs,
                1e-5,
            ) {
                failed.push(case.name);
            }
            let errs = [
                ("o", rel_err(&ours[0], &theirs[0])),
                ("dq", rel_err(&ours[1], &theirs[1])),
                ("dk", rel_err(&ours[2], &theirs[2])),
                ("dv", rel_err(&ours[3], &theirs[3])),
            ];
            if !check(&format!("{}: vs candle f32", case.name), &errs, bound(dt)) {
                failed.push(case.name);
            }
        }
    }
    assert!(failed.is_empty(), "failed: {failed:?}");
    Ok(())
}

/// The LSE the backward reads is the forward's: a second backward of the same graph (which
/// reads the kept LSE again) gives the same gradients, and an f32 input is refused clearly.
#[test]
fn candle_op_keeps_lse_and_refuses_f32() -> Result<()> {
    let Some(dev) = device("candle_op_keeps_lse_and_refuses_f32") else {
        return Ok(());
    };
    let q =
        Var::from_tensor(&Tensor::randn(0f32, 1.0, (1, 64, 2, 64), &dev)?.to_dtype(DType::BF16)?)?;
    // Deterministic: the backward's dQ accumulation is otherwise free to round differently.
    let options = FlashOptions::new(AttentionOptions::new().causal(true)).deterministic(true);
    let o = flash_attn(q.as_tensor(), q.as_tensor(), q.as_tensor(), &options)?;
    let loss = o.to_dtype(DType::F32)?.sum_all()?;
    let a = host_f32(loss.backward()?.get(q.as_tensor()).expect("dq"))?;
    let b = host_f32(loss.backward()?.get(q.as_tensor()).expect("dq"))?;
    assert_eq!(a, b, "two backward passes of one forward differ");

    let f32_q = Tensor::randn(0f32, 1.0, (1, 64, 2, 64), &dev)?;
    let err = flash_attn(&f32_q, &f32_q, &f32_q, &options).expect_err("f32 is refused");
    assert!(err.to_string().contains("bf16 or f16"), "{err}");
    Ok(())
}
