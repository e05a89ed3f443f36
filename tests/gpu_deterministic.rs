//! `FlashOptions::deterministic(true)`: the backward's dQ, dK and dV bitwise identical from run to
//! run, on every family (exact: a row-owned dQ pass; sm80 and sm90: dQ atomics ordered by a
//! semaphore per Q block; a family the device cannot run says so in a visible line). Fresh random
//! inputs with many K/V blocks adding to each Q block (700 keys, GQA; head dims 64, 80, 128 and
//! the head-dim-sliced 160, 192, 256),
//! four runs into fresh NaN-poisoned buffers, each checked against the f64 reference too (bounds
//! as in `tests/gpu_matrix.rs`: ‖out − ref‖/‖ref‖ ≤ 1e-2 for bf16).

use flash_attn::reference::{backward_f32, forward_f32};
use flash_attn::{
    AttentionOptions, AttentionShape, BackwardInputs, DType, DeviceF32, DeviceTensor, Direction,
    FlashOptions, GradientBuffers, KernelChoice, Workspace,
};
use flash_attn_testkit::testing::{families, fresh_seed, gpu_or_skip, rel_err, skip};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const RUNS: usize = 4;

#[test]
fn deterministic_gradients_are_bitwise_identical_across_runs() {
    let test = "deterministic_gradients_are_bitwise_identical_across_runs";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(fresh_seed(test));
    let dtype = DType::Bf16;
    let mut failures = Vec::new();
    let mut ran = 0;
    // 80 and 160: head dims zero-padded to the compiled 128 and 192 (their dQ adds skip the
    // padding columns); 160, 192 and 256 add dQ in head-dim slices, each in key order.
    for head_dim in [64, 80, 128, 160, 192, 256] {
        for causal in [false, true] {
            let s = AttentionShape {
                batch: 2,
                n_q: 650,
                n_k: 700,
                heads_q: 4,
                heads_kv: 2,
                head_dim,
                head_dim_v: head_dim,
            };
            let mut draw = |n: usize, r: f32| -> Vec<f32> {
                (0..n).map(|_| dtype.round(rng.gen_range(-r..r))).collect()
            };
            let (q, k, v, d_o) = (
                draw(s.q_elems(), 2.0),
                draw(s.k_elems(), 2.0),
                draw(s.v_elems(), 1.0),
                draw(s.q_elems(), 1.0),
            );
            let a = AttentionOptions::new().causal(causal);
            let want = forward_f32(&s, &q, &k, &v, &a).unwrap();
            let grads = backward_f32(&s, &q, &k, &v, &d_o, &a).unwrap();
            let up = |x: &[f32]| DeviceTensor::from_f32(dtype, x).unwrap();
            let o_ref: Vec<f32> = want.o.iter().map(|&x| dtype.round(x as f32)).collect();
            let lse_ref: Vec<f32> = want.lse.iter().map(|&x| x as f32).collect();
            let (qd, kd, vd, dod, od) = (up(&q), up(&k), up(&v), up(&d_o), up(&o_ref));
            let lsed = DeviceF32::from_slice(&lse_ref).unwrap();
            let inputs = BackwardInputs {
                q: &qd,
                k: &kd,
                v: &vd,
                o: &od,
                d_o: &dod,
                lse: &lsed,
            };
            for family in families() {
                let options = FlashOptions::new(a.clone())
                    .deterministic(true)
                    .kernel(KernelChoice::Only(family));
                let plan = match flash_attn::plan(&gpu, &s, dtype, &options, Direction::Backward) {
                    Ok(plan) => plan,
                    Err(e) => {
                        skip(
                            &format!("{test} {family} d={head_dim} causal={causal}"),
                            &e.to_string(),
                        );
                        continue;
                    }
                };
                ran += 1;
                let workspace = Workspace::new(&plan).unwrap();
                let mut first: Option<[Vec<u16>; 3]> = None;
                for run in 0..RUNS {
                    let out = GradientBuffers::poisoned(&s, dtype).unwrap();
                    flash_attn::backward_into(&gpu, &s, &inputs, &out, &workspace, &options)
                        .unwrap();
                    gpu.synchronize().unwrap();
                    let bits = [&out.dq, &out.dk, &out.dv].map(|t| t.to_bits16().unwrap());
                    let errs = [
                        ("dq", rel_err(&out.dq.to_f32().unwrap(), &grads.dq)),
                        ("dk", rel_err(&out.dk.to_f32().unwrap(), &grads.dk)),
                        ("dv", rel_err(&out.dv.to_f32().unwrap(), &grads.dv)),
                    ];
                    let accurate = errs.iter().all(|(_, e)| *e <= 1e-2);
                    let same = first.as_ref().is_none_or(|f| *f == bits);
                    let line = format!(
                        "{} {family} {} d={head_dim} causal={causal} run {run}: {errs:?}, bitwise equal to run 0: {same}",
                        if accurate && same { "ok  " } else { "FAIL" },
                        plan.entry
                    );
                    eprintln!("{line}");
                    if !(accurate && same) {
                        failures.push(line);
                    }
                    first.get_or_insert(bits);
                }
            }
        }
    }
    assert!(ran > 0, "no family ran a deterministic backward");
    assert!(failures.is_empty(), "{failures:#?}");
}
