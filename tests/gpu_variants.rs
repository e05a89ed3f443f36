//! Every compiled tensor-core instance — the defaults the plan picks and, with the `tuning`
//! feature, the candidates
//! (`sm80::forward::VARIANTS`, `sm80::backward::VARIANTS`, `sm90::VARIANTS`,
//! `sm90::BACKWARD_VARIANTS`) — against the f64 reference on fresh random inputs, through
//! `forward_variant_into` / `backward_variant_into` into NaN-poisoned outputs. The `wgmma` ones
//! run where the device loads the sm_90a module; a visible line says when they are not tested.
//!
//! The backward gets O and LSE from the reference forward (O rounded to the dtype), so it is
//! checked on its own. Bounds as in `tests/gpu_matrix.rs`: ‖out − ref‖/‖ref‖ ≤ 1e-2 (bf16),
//! 2e-3 (f16); LSE within 2e-3.

use attention_kernels::kernels::{sm80, sm90};
use flash_attn::reference::{backward_f32, forward_f32};
use flash_attn::{
    AttentionOptions, AttentionShape, BackwardInputs, DType, DeviceF32, DeviceTensor, Family,
    FlashOptions, GradientBuffers, KernelChoice, Tiles, Workspace,
};
use flash_attn_testkit::testing::{fresh_seed, gpu_or_skip, lse_err, rel_err, skip};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn bound(dtype: DType) -> f64 {
    if dtype == DType::Bf16 { 1e-2 } else { 2e-3 }
}

/// `n` fresh values in (−r, r), rounded to `dtype`.
fn draw(rng: &mut StdRng, dtype: DType, n: usize, r: f32) -> Vec<f32> {
    (0..n).map(|_| dtype.round(rng.gen_range(-r..r))).collect()
}

/// Prints the case's errors and keeps its line among `failures` if one is past its bound.
fn judge(failures: &mut Vec<String>, dtype: DType, case: String, errs: &[(&str, f64)]) {
    let ok = errs
        .iter()
        .all(|(n, e)| *e <= if *n == "lse" { 2e-3 } else { bound(dtype) });
    let line = format!("{} {case}: {errs:?}", if ok { "ok  " } else { "FAIL" });
    println!("{line}");
    if !ok {
        failures.push(line);
    }
}

fn head_dim(t: &Tiles) -> u32 {
    match t {
        Tiles::Sm80Forward(c) => c.head_dim,
        Tiles::Sm90Forward(c) => c.head_dim,
        Tiles::Sm80Backward(c) => c.head_dim,
        Tiles::Sm90Backward(c) => c.head_dim,
        Tiles::Decode(c) => c.head_dim,
        Tiles::Exact(_) => 0,
    }
}

#[test]
fn every_tensor_core_instance_matches_the_reference() {
    let test = "every_tensor_core_instance_matches_the_reference";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let mut forward: Vec<Tiles> = sm80::forward::VARIANTS
        .iter()
        .copied()
        .map(Tiles::Sm80Forward)
        .collect();
    let mut backward: Vec<Tiles> = sm80::backward::VARIANTS
        .iter()
        .copied()
        .map(Tiles::Sm80Backward)
        .collect();
    if gpu.has_wgmma() {
        forward.extend(sm90::VARIANTS.iter().copied().map(Tiles::Sm90Forward));
        backward.extend(
            sm90::BACKWARD_VARIANTS
                .iter()
                .copied()
                .map(Tiles::Sm90Backward),
        );
    } else {
        skip(
            &format!("wgmma instances in {test}"),
            &format!("{} loads no sm_90a module", gpu.device_name()),
        );
    }
    let mut rng = StdRng::seed_from_u64(fresh_seed(test));
    // (batch, n_q, n_k, heads_q, heads_kv): one token, tails of every kind, GQA and MQA, n_q > n_k
    // (causal rows that see no key), a long key loop.
    let shapes = [
        (1, 1, 1, 1, 1),
        (2, 200, 200, 4, 2),
        (1, 77, 300, 2, 1),
        (1, 300, 77, 2, 2),
        (1, 513, 1000, 2, 2),
    ];
    let mut failures = Vec::new();
    for dtype in [DType::Bf16, DType::F16] {
        for d in [32, 64, 96, 128] {
            for causal in [false, true] {
                for &(batch, n_q, n_k, heads_q, heads_kv) in &shapes {
                    let s = AttentionShape::new(batch, n_q, n_k, heads_q, heads_kv, d);
                    let (q, k, v, d_o) = (
                        draw(&mut rng, dtype, s.q_elems(), 2.0),
                        draw(&mut rng, dtype, s.k_elems(), 2.0),
                        draw(&mut rng, dtype, s.v_elems(), 1.0),
                        draw(&mut rng, dtype, s.q_elems(), 1.0),
                    );
                    let a = AttentionOptions::new().causal(causal);
                    let opts = FlashOptions::new(a.clone());
                    let want = forward_f32(&s, &q, &k, &v, &a).unwrap();
                    let want_grads = backward_f32(&s, &q, &k, &v, &d_o, &a).unwrap();
                    let up = |x: &[f32]| DeviceTensor::from_f32(dtype, x).unwrap();
                    let (qd, kd, vd, dod) = (up(&q), up(&k), up(&v), up(&d_o));
                    let mut check = |entry: String, errs: Vec<(&str, f64)>| {
                        let case = format!("{entry} causal={causal} {s:?}");
                        judge(&mut failures, dtype, case, &errs);
                    };

                    for &tiles in forward.iter().filter(|t| head_dim(t) == d) {
                        let o = DeviceTensor::poisoned(dtype, s.o_elems()).unwrap();
                        let lse = DeviceF32::poisoned(s.row_elems()).unwrap();
                        let plan = flash_attn::forward_variant_into(
                            &gpu, &s, tiles, &qd, &kd, &vd, &o, &lse, &opts,
                        )
                        .unwrap();
                        gpu.synchronize().unwrap();
                        check(
                            plan.entry,
                            vec![
                                ("o", rel_err(&o.to_f32().unwrap(), &want.o)),
                                ("lse", lse_err(&lse.to_vec().unwrap(), &want.lse)),
                            ],
                        );
                    }

                    let o_ref: Vec<f32> = want.o.iter().map(|&x| dtype.round(x as f32)).collect();
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
                    for &tiles in backward.iter().filter(|t| head_dim(t) == d) {
                        let out = GradientBuffers::poisoned(&s, dtype).unwrap();
                        let plan = flash_attn::plan(
                            &gpu,
                            &s,
                            dtype,
                            &opts,
                            flash_attn::Direction::Backward,
                        )
                        .unwrap();
                        let workspace = Workspace::new(&plan).unwrap();
                        let plan = flash_attn::backward_variant_into(
                            &gpu, &s, tiles, &inputs, &out, &workspace, &opts,
                        )
                        .unwrap();
                        gpu.synchronize().unwrap();
                        check(
                            plan.entry,
                            vec![
                                ("dq", rel_err(&out.dq.to_f32().unwrap(), &want_grads.dq)),
                                ("dk", rel_err(&out.dk.to_f32().unwrap(), &want_grads.dk)),
                                ("dv", rel_err(&out.dv.to_f32().unwrap(), &want_grads.dv)),
                            ],
                        );
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Where the plan's choice depends on the length: d = 64's plain forward without the causal
/// mask runs `sm90::D64_WS` from `sm90::D64_WS_MIN_ROWS` query rows (192-row blocks, the last
/// one partial in the second shape), through `forward_into` into NaN-poisoned outputs against
/// f64. Few keys keep the reference quick.
#[test]
fn long_d64_plain_forwards_run_the_warp_specialized_tiles_and_match_the_reference() {
    let test = "long_d64_plain_forwards_run_the_warp_specialized_tiles_and_match_the_reference";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    if !gpu.has_wgmma() {
        skip(
            test,
            &format!("{} loads no sm_90a module", gpu.device_name()),
        );
        return;
    }
    let mut rng = StdRng::seed_from_u64(fresh_seed(test));
    let rows = sm90::D64_WS_MIN_ROWS;
    let mut failures = Vec::new();
    for dtype in [DType::Bf16, DType::F16] {
        for (batch, n_q, n_k, heads_q, heads_kv) in
            [(1, rows, 300, 2, 1), (2, rows + 100, 777, 3, 1)]
        {
            let s = AttentionShape::new(batch, n_q, n_k, heads_q, heads_kv, 64);
            let (q, k, v) = (
                draw(&mut rng, dtype, s.q_elems(), 2.0),
                draw(&mut rng, dtype, s.k_elems(), 2.0),
                draw(&mut rng, dtype, s.v_elems(), 1.0),
            );
            let a = AttentionOptions::new();
            let want = forward_f32(&s, &q, &k, &v, &a).unwrap();
            let up = |x: &[f32]| DeviceTensor::from_f32(dtype, x).unwrap();
            let o = DeviceTensor::poisoned(dtype, s.o_elems()).unwrap();
            let lse = DeviceF32::poisoned(s.row_elems()).unwrap();
            let opts = FlashOptions::new(a);
            let plan =
                flash_attn::forward_into(&gpu, &s, &up(&q), &up(&k), &up(&v), &o, &lse, &opts)
                    .unwrap();
            gpu.synchronize().unwrap();
            assert_eq!(plan.tiles, Tiles::Sm90Forward(sm90::D64_WS), "{s:?}");
            let errs = [
                ("o", rel_err(&o.to_f32().unwrap(), &want.o)),
                ("lse", lse_err(&lse.to_vec().unwrap(), &want.lse)),
            ];
            judge(&mut failures, dtype, format!("{} {s:?}", plan.entry), &errs);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Scales other than 1/√d, zero and negative among them, on every forward family the plan can
/// run them on: the `wgmma` forward folds a positive scale into the exponent's `fma` (the raw
/// scores' maximum, scaled, is the scaled scores'), any other one is applied first; both must
/// match the reference, with and without the causal mask and a window.
#[test]
fn every_forward_family_takes_any_finite_scale() {
    let test = "every_forward_family_takes_any_finite_scale";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let mut families = vec![Family::Sm80, Family::Decode];
    if gpu.has_wgmma() {
        families.push(Family::Sm90);
    } else {
        skip(
            test,
            &format!(
                "{} loads no sm_90a module: sm90 untested",
                gpu.device_name()
            ),
        );
    }
    let mut rng = StdRng::seed_from_u64(fresh_seed(test));
    let mut failures = Vec::new();
    let dtype = DType::Bf16;
    for family in families {
        // Decode takes few query rows per K/V head; the others a block of rows and more.
        let shapes = if family == Family::Decode {
            vec![AttentionShape::new(2, 1, 700, 8, 2, 128)]
        } else {
            vec![
                AttentionShape::new(1, 300, 333, 2, 1, 128),
                AttentionShape::new(2, 200, 250, 2, 2, 64),
            ]
        };
        for s in shapes {
            let (q, k, v) = (
                draw(&mut rng, dtype, s.q_elems(), 2.0),
                draw(&mut rng, dtype, s.k_elems(), 2.0),
                draw(&mut rng, dtype, s.v_elems(), 1.0),
            );
            let up = |x: &[f32]| DeviceTensor::from_f32(dtype, x).unwrap();
            let (dq, dk, dv) = (up(&q), up(&k), up(&v));
            for scale in [0.0, -0.2, 0.05, 0.4] {
                // Decode takes no window.
                let masks: &[(bool, Option<(u32, u32)>)] = if family == Family::Decode {
                    &[(false, None), (true, None)]
                } else {
                    &[(false, None), (true, None), (false, Some((90, 40)))]
                };
                for &(causal, window) in masks {
                    let mut a = AttentionOptions::new().scale(scale).causal(causal);
                    if let Some((left, right)) = window {
                        a = a.window(left, right);
                    }
                    let want = forward_f32(&s, &q, &k, &v, &a).unwrap();
                    let o = DeviceTensor::poisoned(dtype, s.o_elems()).unwrap();
                    let lse = DeviceF32::poisoned(s.row_elems()).unwrap();
                    let opts = FlashOptions::new(a).kernel(KernelChoice::Only(family));
                    let plan =
                        flash_attn::forward_into(&gpu, &s, &dq, &dk, &dv, &o, &lse, &opts).unwrap();
                    gpu.synchronize().unwrap();
                    let errs = [
                        ("o", rel_err(&o.to_f32().unwrap(), &want.o)),
                        ("lse", lse_err(&lse.to_vec().unwrap(), &want.lse)),
                    ];
                    let case = format!(
                        "{} scale {scale} causal {causal} window {window:?} {s:?}",
                        plan.entry
                    );
                    judge(&mut failures, dtype, case, &errs);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
