//! The tensor-core forward against the f64 CPU reference (`attention_host::reference`) on fresh
//! random inputs, for every compiled tile variant: the `mma.sync` kernels everywhere, the `wgmma`
//! ones where the device loads the sm_90a module (a visible line says when they are not tested).
//! Outputs are NaN-poisoned before each launch, so an unwritten element fails. Skips, with a
//! visible line, where no CUDA device answers.

use attention_kernels::{flash_tc, flash_wgmma};
use flash_attn::reference;
use flash_attn::tensor_core::{
    ForwardOutput, TcKernel, tensor_core_forward, tensor_core_forward_variant_into,
    tensor_core_kernel,
};
use flash_attn::testing::{fresh_seed, gpu_or_skip, skip};
use flash_attn::{AttentionOptions, AttentionShape, DType, DeviceF32, DeviceTensor, Gpu};
use rand::{Rng, SeedableRng};

/// Runs `cfg` through the public entry point when it is this device's default, else as a variant.
fn run(
    gpu: &Gpu,
    cfg: TcKernel,
    s: &AttentionShape,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    opts: &AttentionOptions,
) -> ForwardOutput {
    if tensor_core_kernel(gpu, s, q.dtype(), opts).unwrap() == cfg {
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

fn rel_l2(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(&a, &b)| (a as f64 - b).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| b.powi(2)).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

#[test]
fn tensor_core_forward_matches_reference() {
    let Some(gpu) = gpu_or_skip("tensor_core_forward_matches_reference") else {
        return;
    };
    let seed = fresh_seed("tensor_core_forward_matches_reference");
    let mut kernels: Vec<TcKernel> = flash_tc::VARIANTS.into_iter().map(Into::into).collect();
    if gpu.has_wgmma() {
        kernels.extend(flash_wgmma::VARIANTS.into_iter().map(TcKernel::from));
    } else {
        skip(
            "wgmma kernels in tensor_core_forward_matches_reference",
            &format!("{} loads no sm_90a module", gpu.device_name()),
        );
    }
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
                    let want = reference::forward_f32(&s, &q, &k, &v, &opts).unwrap();

                    for &cfg in kernels.iter().filter(|c| c.head_dim() == head_dim) {
                        let out = run(&gpu, cfg, &s, &qd, &kd, &vd, &opts);
                        let o = out.o.to_f32().unwrap();
                        let lse = out.lse.to_vec().unwrap();
                        let o_err = rel_l2(&o, &want.o);
                        let lse_err = lse.iter().zip(&want.lse).fold(0.0f64, |acc, (&g, &w)| {
                            if w == f64::NEG_INFINITY && g == f32::NEG_INFINITY {
                                acc
                            } else {
                                flash_attn::testing::worst(acc, (g as f64 - w).abs())
                            }
                        });
                        let finite = o.iter().all(|x| x.is_finite());
                        let ok = finite && o_err <= o_tol && lse_err <= lse_tol; // NaN errors fail these comparisons.
                        let name = cfg.name(dtype);
                        println!(
                            "{} {name} causal={causal} b={batch} nq={n_q} nk={n_k} hq={heads_q} hkv={heads_kv}: O rel {o_err:.2e} LSE abs {lse_err:.2e}",
                            if ok { "ok  " } else { "FAIL" }
                        );
                        if !ok {
                            failures.push(format!("{name} causal={causal} {s:?}"));
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
