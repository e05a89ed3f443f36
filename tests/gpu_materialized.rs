//! The materialized baseline on the GPU against the f64 reference on every row, for every
//! storage dtype, with and without the causal mask, on shapes with tails and GQA.

use flash_attn::materialized::{MaterializedWorkspace, materialized_forward};
use flash_attn::reference::forward_f32;
use flash_attn::{AttentionOptions, AttentionShape, DType, DeviceTensor};
use flash_attn_testkit::inputs::uniform;
use flash_attn_testkit::sampled_rows::relative_error;
use flash_attn_testkit::testing::{fresh_seed, gpu_or_skip};

/// Relative-error bound by dtype: S and P are stored in the working dtype, so bf16 (8-bit
/// mantissa) rounds each probability to ~2⁻⁹ relative, f16 to ~2⁻¹²; f32 stays near ex2.approx's
/// ~2 ulp.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 4e-3,
        DType::Bf16 => 2e-2,
    }
}

#[test]
fn materialized_matches_f64_on_every_row() {
    let Some(gpu) = gpu_or_skip("materialized_matches_f64_on_every_row") else {
        return;
    };
    let seed = fresh_seed("materialized_matches_f64_on_every_row");
    let shapes = [
        AttentionShape {
            batch: 2,
            n_q: 77,
            n_k: 130,
            heads_q: 4,
            heads_kv: 2,
            head_dim: 40,
            head_dim_v: 40,
        },
        AttentionShape {
            batch: 1,
            n_q: 1,
            n_k: 17,
            heads_q: 2,
            heads_kv: 1,
            head_dim: 64,
            head_dim_v: 64,
        },
        AttentionShape {
            batch: 1,
            n_q: 97,
            n_k: 33,
            heads_q: 3,
            heads_kv: 3,
            head_dim: 128,
            head_dim_v: 128,
        },
    ];
    let mut worst = [0.0f64; 3];
    for (si, shape) in shapes.iter().enumerate() {
        for (di, dtype) in DType::ALL.into_iter().enumerate() {
            for causal in [false, true] {
                let options = AttentionOptions::new().causal(causal);
                let s = seed.wrapping_add(100 * si as u64 + 10 * di as u64);
                let round =
                    |v: Vec<f32>| -> Vec<f32> { v.into_iter().map(|x| dtype.round(x)).collect() };
                let q = round(uniform(s, shape.q_elems()));
                let k = round(uniform(s + 1, shape.k_elems()));
                let v = round(uniform(s + 2, shape.v_elems()));
                let (qd, kd, vd) = (
                    DeviceTensor::from_f32(dtype, &q).unwrap(),
                    DeviceTensor::from_f32(dtype, &k).unwrap(),
                    DeviceTensor::from_f32(dtype, &v).unwrap(),
                );
                let workspace = MaterializedWorkspace::new(shape, dtype).unwrap();
                let o = DeviceTensor::poisoned(dtype, shape.o_elems()).unwrap();
                materialized_forward(&gpu, &workspace, &qd, &kd, &vd, &o, &options).unwrap();
                gpu.synchronize().unwrap();
                let out = o.to_f32().unwrap();
                assert!(
                    out.iter().all(|x| x.is_finite()),
                    "unwritten or non-finite output: {shape:?} {dtype} causal={causal}"
                );
                let want = forward_f32(shape, &q, &k, &v, &options).unwrap();
                let got: Vec<f64> = out.iter().map(|&x| x as f64).collect();
                let err = relative_error(&got, &want.o);
                worst[di] = flash_attn_testkit::testing::worst(worst[di], err);
                assert!(
                    err <= tolerance(dtype),
                    "{shape:?} {dtype} causal={causal}: relative error {err:.3e}"
                );
            }
        }
    }
    eprintln!(
        "materialized worst relative error: f32 {:.2e}, f16 {:.2e}, bf16 {:.2e}",
        worst[0], worst[1], worst[2]
    );
}

#[test]
fn materialized_refuses_mismatched_buffers_before_launch() {
    let Some(gpu) = gpu_or_skip("materialized_refuses_mismatched_buffers_before_launch") else {
        return;
    };
    let shape = AttentionShape {
        batch: 1,
        n_q: 8,
        n_k: 8,
        heads_q: 2,
        heads_kv: 2,
        head_dim: 16,
        head_dim_v: 16,
    };
    let good = DeviceTensor::from_f32(DType::F32, &uniform(1, shape.q_elems())).unwrap();
    let short = DeviceTensor::from_f32(DType::F32, &uniform(2, shape.q_elems() - 1)).unwrap();
    let workspace = MaterializedWorkspace::new(&shape, DType::F32).unwrap();
    let o = DeviceTensor::poisoned(DType::F32, shape.o_elems()).unwrap();
    let err = materialized_forward(
        &gpu,
        &workspace,
        &good,
        &short,
        &good,
        &o,
        &AttentionOptions::new(),
    )
    .unwrap_err();
    assert!(
        matches!(err, flash_attn::AttentionError::InvalidInput(_)),
        "{err}"
    );
}
