//! The tensor-core forward against a higher-precision result on fresh random inputs.
//!
//! Until `attention_host::reference` (the f64 CPU reference) is merged, `O` is checked against the
//! materialized baseline run in f32 on the same (already rounded) inputs, and `LSE` against an f64
//! log-sum-exp computed here. Outputs are NaN-poisoned before each launch, so an unwritten element
//! fails. Skips, with a visible line, where no CUDA device answers.

use attention_kernels::flash_tc;
use attention_kernels::params::causal_key_end;
use flash_attn::materialized::{MaterializedWorkspace, materialized_forward};
use flash_attn::{
    AttentionError, AttentionOptions, AttentionShape, DType, DeviceF32, DeviceTensor,
    ForwardOutput, Gpu, tensor_core_forward, tensor_core_forward_variant_into,
};
use rand::{Rng, SeedableRng};

fn gpu_or_skip(test: &str) -> Option<Gpu> {
    match flash_attn::gpu() {
        Ok(gpu) => Some(gpu),
        Err(AttentionError::NoDevice(why)) => {
            println!("SKIP {test}: no CUDA device answered ({why})");
            None
        }
        Err(e) => panic!("creating the GPU context: {e}"),
    }
}

/// `LSE` of every `(b, h, i)` in f64 from the rounded inputs; `−∞` where no key is allowed.
fn lse_f64(s: &AttentionShape, q: &[f32], k: &[f32], scale: f32, causal: bool) -> Vec<f64> {
    let d = s.head_dim as usize;
    let mut out = Vec::with_capacity(s.row_elems());
    for b in 0..s.batch {
        for h in 0..s.heads_q {
            let hk = s.kv_head(h);
            for i in 0..s.n_q {
                let end = if causal {
                    causal_key_end(i, s.n_q, s.n_k)
                } else {
                    s.n_k
                };
                let qi = &q[((b * s.n_q + i) * s.heads_q + h) as usize * d..][..d];
                let scores: Vec<f64> = (0..end)
                    .map(|j| {
                        let kj = &k[((b * s.n_k + j) * s.heads_kv + hk) as usize * d..][..d];
                        scale as f64
                            * qi.iter()
                                .zip(kj)
                                .map(|(&x, &y)| x as f64 * y as f64)
                                .sum::<f64>()
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                out.push(if end == 0 {
                    f64::NEG_INFINITY
                } else {
                    m + scores.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
                });
            }
        }
    }
    out
}

/// Runs `cfg` through the public entry point when it is the default, else as a variant.
fn run(
    gpu: &Gpu,
    cfg: flash_tc::TcConfig,
    s: &AttentionShape,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    opts: &AttentionOptions,
) -> ForwardOutput {
    if flash_tc::config(s.head_dim) == Some(cfg) {
        return tensor_core_forward(gpu, s, q, k, v, opts).unwrap();
    }
    let out = ForwardOutput {
        o: DeviceTensor::poisoned(q.dtype(), s.q_elems()).unwrap(),
        lse: DeviceF32::poisoned(s.row_elems()).unwrap(),
    };
    tensor_core_forward_variant_into(gpu, cfg, s, q, k, v, &out, opts).unwrap();
    gpu.synchronize().unwrap();
    out
}

fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|&b| (b as f64).powi(2)).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

#[test]
fn tensor_core_forward_matches_reference() {
    let Some(gpu) = gpu_or_skip("tensor_core_forward_matches_reference") else {
        return;
    };
    let seed: u64 = rand::thread_rng().r#gen();
    println!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // (batch, n_q, n_k, heads_q, heads_kv): tails on both sides, GQA, MQA, n_q > n_k (causal rows
    // with no allowed key), exact tile multiples, one token, a long key loop.
    let shapes = [
        (1, 1, 1, 1, 1),
        (2, 200, 200, 4, 2),
        (1, 77, 300, 2, 1),
        (1, 300, 77, 2, 2),
        (1, 64, 256, 1, 1),
        (1, 513, 1000, 2, 2),
    ];
    let mut failures = Vec::new();
    for dtype in [DType::Bf16, DType::F16] {
        let (o_tol, lse_tol) = if dtype == DType::Bf16 {
            (1e-2, 2e-3)
        } else {
            (2e-3, 2e-3)
        };
        for head_dim in [64, 128] {
            for causal in [false, true] {
                for &(batch, n_q, n_k, heads_q, heads_kv) in &shapes {
                    let s = AttentionShape {
                        batch,
                        n_q,
                        n_k,
                        heads_q,
                        heads_kv,
                        head_dim,
                    };
                    let mut draw = |n: usize, r: f32| -> Vec<f32> {
                        (0..n).map(|_| dtype.round(rng.gen_range(-r..r))).collect()
                    };
                    let (q, k, v) = (
                        draw(s.q_elems(), 2.0),
                        draw(s.kv_elems(), 2.0),
                        draw(s.kv_elems(), 1.0),
                    );
                    let opts = AttentionOptions::new().causal(causal);
                    let upload = |t: DType, x: &[f32]| DeviceTensor::from_f32(t, x).unwrap();
                    let (qd, kd, vd) = (upload(dtype, &q), upload(dtype, &k), upload(dtype, &v));
                    let o_ref = {
                        let o = DeviceTensor::poisoned(DType::F32, s.q_elems()).unwrap();
                        let ws = MaterializedWorkspace::new(&s, DType::F32).unwrap();
                        materialized_forward(
                            &gpu,
                            &ws,
                            &upload(DType::F32, &q),
                            &upload(DType::F32, &k),
                            &upload(DType::F32, &v),
                            &o,
                            &opts,
                        )
                        .unwrap();
                        gpu.synchronize().unwrap();
                        o.to_f32().unwrap()
                    };
                    let lse_ref = lse_f64(&s, &q, &k, opts.scale_for(head_dim), causal);

                    for cfg in flash_tc::VARIANTS
                        .into_iter()
                        .filter(|c| c.head_dim == head_dim)
                    {
                        let out = run(&gpu, cfg, &s, &qd, &kd, &vd, &opts);
                        let o = out.o.to_f32().unwrap();
                        let lse = out.lse.to_vec().unwrap();
                        let o_err = rel_l2(&o, &o_ref);
                        let lse_err = lse.iter().zip(&lse_ref).fold(0.0f64, |acc, (&g, &w)| {
                            if w == f64::NEG_INFINITY && g == f32::NEG_INFINITY {
                                acc
                            } else {
                                acc.max((g as f64 - w).abs())
                            }
                        });
                        let finite = o.iter().all(|x| x.is_finite());
                        let ok = finite && o_err <= o_tol && lse_err <= lse_tol; // NaN errors fail these comparisons.
                        let (w, kb) = (cfg.warps, cfg.block_keys);
                        println!(
                            "{} {dtype} d={head_dim} w{w} k{kb} causal={causal} b={batch} nq={n_q} nk={n_k} hq={heads_q} hkv={heads_kv}: O rel {o_err:.2e} LSE abs {lse_err:.2e}",
                            if ok { "ok  " } else { "FAIL" }
                        );
                        if !ok {
                            failures.push(format!("{dtype} w{w} k{kb} causal={causal} {s:?}"));
                        }
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "seed {seed}: {} cases failed: {failures:#?}",
        failures.len()
    );
}
