//! The exact kernels' test matrix (`tests/gpu_exact.rs`) for the tensor-core kernels, on their
//! domain: bf16 and f16, head dims 64 and 128, and every other axis of that matrix — causal or
//! not, the same (N_q, N_k) list (tails, N_q ≠ N_k, one token, 4097), dropout, GQA/MQA, and the
//! three length modes (full, per-item key lengths, packed sequences). A covering list of 36
//! cases, fresh random inputs, outputs NaN-poisoned by the launchers, each pass against the f64
//! reference given the same dtype-rounded inputs.
//!
//! The backward gets O and LSE from the reference forward (O rounded to the dtype), so it is
//! checked on its own. On a device without the `wgmma` kernels the `mma.sync` ones run the cases
//! without dropout or length masks and a visible line says the others were not run there.
//!
//! Bounds on ‖out − ref‖/‖ref‖ are those of `tests/gpu_exact.rs` and
//! `tests/gpu_tensor_core_backward.rs` (bf16 1e-2, f16 2e-3; LSE 2e-3 absolute).

use flash_attn::reference::{backward_f32, forward_f32};
use flash_attn::tensor_core::{TcKernel, tensor_core_forward, tensor_core_kernel};
use flash_attn::tensor_core_backward::{BackwardInputs, tensor_core_backward};
use flash_attn::{AttentionOptions, AttentionShape, DType, DeviceF32, DeviceTensor};
use flash_attn_testkit::testing::{
    LengthMode, MATRIX_SIZES, fresh_seed, gpu_or_skip, lse_err, rel_err, skip,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Clone, Copy, Debug)]
struct Case {
    dtype: DType,
    causal: bool,
    head_dim: u32,
    n_q: u32,
    n_k: u32,
    dropout: bool,
    heads: (u32, u32),
    lengths: LengthMode,
}

/// Axis `a` of case `i` takes value `i mod |a|` (binary axes at different strides), so every
/// value of every axis appears and pairs vary; long sequences keep two query heads.
fn cases() -> Vec<Case> {
    let heads = [(2, 2), (4, 2), (3, 1)];
    (0..36)
        .map(|i| {
            let (n_q, n_k) = MATRIX_SIZES[i % MATRIX_SIZES.len()];
            let long = n_q.max(n_k) >= 1000;
            Case {
                dtype: [DType::Bf16, DType::F16][i % 2],
                causal: (i / 2) % 2 == 1,
                head_dim: [64, 128][(i / 3) % 2],
                n_q,
                n_k,
                dropout: (i / 5) % 2 == 1,
                heads: if long { (2, 1) } else { heads[(i / 4) % 3] },
                lengths: LengthMode::ALL[(i / 7) % 3],
            }
        })
        .collect()
}

fn shape_and_options(case: &Case, rng: &mut StdRng) -> (AttentionShape, AttentionOptions) {
    let shape = AttentionShape {
        batch: case.lengths.batch(),
        n_q: case.n_q,
        n_k: case.n_k,
        heads_q: case.heads.0,
        heads_kv: case.heads.1,
        head_dim: case.head_dim,
    };
    let mut a = case.lengths.apply(
        AttentionOptions::new().causal(case.causal),
        (case.n_q, case.n_k),
        rng,
    );
    if case.dropout {
        a = a.dropout(0.17, rng.r#gen(), rng.gen_range(0..1000));
    }
    (shape, a)
}

fn bound(dtype: DType) -> f64 {
    if dtype == DType::Bf16 { 1e-2 } else { 2e-3 }
}

#[test]
fn tensor_core_matrix_against_the_f64_reference() {
    let test = "tensor_core_matrix_against_the_f64_reference";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(fresh_seed(test));
    let list = cases();
    for n in [1, 17, 97, 128, 1000, 4097] {
        assert!(list.iter().any(|c| c.n_q == n) && list.iter().any(|c| c.n_k == n));
    }
    for d in [64, 128] {
        for mode in LengthMode::ALL {
            assert!(
                list.iter().any(|c| c.head_dim == d && c.lengths == mode),
                "d={d} {mode:?} missing"
            );
        }
    }
    let (mut failures, mut not_run) = (vec![], 0);
    for case in &list {
        let (shape, options) = shape_and_options(case, &mut rng);
        let dt = case.dtype;
        if (case.dropout || case.lengths != LengthMode::Full) && !gpu.has_wgmma() {
            not_run += 1;
            continue;
        }
        let kernel = tensor_core_kernel(&gpu, &shape, dt, &options).unwrap();
        let mut draw = |n: usize, amp: f32| -> Vec<f32> {
            (0..n)
                .map(|_| dt.round(rng.gen_range(-1.0f32..1.0) * amp))
                .collect()
        };
        let (q, k, v, d_o) = (
            draw(shape.q_elems(), 1.5),
            draw(shape.kv_elems(), 1.5),
            draw(shape.kv_elems(), 1.5),
            draw(shape.q_elems(), 1.0),
        );
        let up = |x: &[f32]| DeviceTensor::from_f32(dt, x).unwrap();
        let (qd, kd, vd, dod) = (up(&q), up(&k), up(&v), up(&d_o));

        let fwd = tensor_core_forward(&gpu, &shape, &qd, &kd, &vd, &options).unwrap();
        let want = forward_f32(&shape, &q, &k, &v, &options).unwrap();
        let o_ref: Vec<f32> = want.o.iter().map(|&x| dt.round(x as f32)).collect();
        let lse_ref: Vec<f32> = want.lse.iter().map(|&x| x as f32).collect();
        let (od, lsed) = (up(&o_ref), DeviceF32::from_slice(&lse_ref).unwrap());
        let inputs = BackwardInputs {
            q: &qd,
            k: &kd,
            v: &vd,
            o: &od,
            d_o: &dod,
            lse: &lsed,
        };
        let grads = tensor_core_backward(&gpu, &shape, &inputs, &options).unwrap();
        let want_grads = backward_f32(&shape, &q, &k, &v, &d_o, &options).unwrap();

        let errs = [
            ("o", rel_err(&fwd.o.to_f32().unwrap(), &want.o)),
            ("dq", rel_err(&grads.dq.to_f32().unwrap(), &want_grads.dq)),
            ("dk", rel_err(&grads.dk.to_f32().unwrap(), &want_grads.dk)),
            ("dv", rel_err(&grads.dv.to_f32().unwrap(), &want_grads.dv)),
        ];
        let lse = lse_err(&fwd.lse.to_vec().unwrap(), &want.lse);
        let ok = errs.iter().all(|e| e.1 <= bound(dt)) && lse <= 2e-3;
        let family = match kernel {
            TcKernel::Wgmma(_) => "wgmma",
            TcKernel::MmaSync(_) => "mma.sync",
        };
        let line = format!(
            "{} {family} {case:?}: {}, lse {lse:.2e}",
            if ok { "ok  " } else { "FAIL" },
            errs.iter()
                .map(|(n, e)| format!("{n} {e:.2e}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!("{line}");
        if !ok {
            failures.push(line);
        }
    }
    if not_run > 0 {
        skip(
            test,
            &format!(
                "{not_run} cases with dropout or length masks: {} has no wgmma kernels",
                gpu.device_name()
            ),
        );
    }
    assert!(
        failures.is_empty(),
        "cases over their bound:\n{}",
        failures.join("\n")
    );
}
