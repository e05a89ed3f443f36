//! The tiled kernels against the f64 CPU reference on the GPU.
//!
//! One parametrised matrix over dtype × schedule × causal × head dim × (N_q, N_k) × dropout × GQA ×
//! lengths (a covering list: every value of every axis appears, the full product would spend
//! hours in the f64 reference), fresh random inputs per case, outputs poisoned with NaN by the
//! launchers before each launch. Plus central finite differences of the GPU forward, bitwise
//! determinism, and device memory that grows linearly with N.
//!
//! Bounds on ‖out − ref‖/‖ref‖, with the reference fed the same dtype-rounded inputs, so only the
//! kernels' arithmetic and the final rounding of outputs count:
//! - f32 `2e-5` (≪ 1e-4): f32 accumulation over up to 4097 keys (≈ √N·2⁻²⁴ relative) plus the
//!   `ex2.approx`/`lg2.approx` error (≈ 2⁻²²).
//! - f16 `2e-3`: outputs rounded to 11 significant bits (2⁻¹¹ ≈ 4.9e-4 per element, half that on
//!   average) and, in the backward, D computed from the stored f16 O, which the chain
//!   `dS = P(dP − D)` amplifies where dP ≈ D.
//! - bf16 `1e-2`: the same with 8 significant bits (2⁻⁸ ≈ 3.9e-3 per element).
//!
//! Where no CUDA device answers, each test prints `SKIP <test>: ...` to stderr and returns.

use flash_attn::testing::{
    LengthMode, MATRIX_SIZES, fresh_seed, gpu_or_skip, lse_err, rel_err, worst as worst_of,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use flash_attn::reference::{backward_f32, forward_f32};
use flash_attn::{
    AttentionError, AttentionOptions, AttentionShape, DType, DeviceTensor, FlashOptions, Gpu,
    Schedule, flash_backward, flash_forward,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn bound(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-5,
        DType::F16 => 2e-3,
        DType::Bf16 => 1e-2,
    }
}

fn random(rng: &mut StdRng, n: usize, dtype: DType) -> Vec<f32> {
    (0..n)
        .map(|_| dtype.round(rng.gen_range(-1.0f32..1.0) * 1.5))
        .collect()
}

#[derive(Clone, Debug)]
struct Case {
    dtype: DType,
    schedule: Schedule,
    causal: bool,
    head_dim: u32,
    n_q: u32,
    n_k: u32,
    dropout: bool,
    heads: (u32, u32),
    lengths: LengthMode,
}

impl Case {
    fn shape_and_options(&self, rng: &mut StdRng) -> (AttentionShape, FlashOptions) {
        let shape = AttentionShape {
            batch: self.lengths.batch(),
            n_q: self.n_q,
            n_k: self.n_k,
            heads_q: self.heads.0,
            heads_kv: self.heads.1,
            head_dim: self.head_dim,
        };
        let mut a = self.lengths.apply(
            AttentionOptions::new().causal(self.causal),
            (self.n_q, self.n_k),
            rng,
        );
        if self.dropout {
            a = a.dropout(0.17, rng.r#gen(), rng.gen_range(0..1000));
        }
        (shape, FlashOptions::new(a).schedule(self.schedule))
    }
}

const HEAD_DIMS: [u32; 8] = [16, 32, 40, 64, 80, 96, 128, 256];

/// The covering list: axis `a` of case `i` takes value `i mod |a|` (binary axes at different
/// strides; head dims count the short cases), so every value of every axis appears and pairs
/// vary. Long sequences keep the head count and head dim modest so the f64 reference stays in
/// seconds.
fn cases() -> Vec<Case> {
    let dtypes = [DType::F32, DType::F16, DType::Bf16];
    let heads = [(2, 2), (4, 2), (3, 1)];
    let mut short_cases = 0;
    (0..36)
        .map(|i| {
            let (n_q, n_k) = MATRIX_SIZES[i % MATRIX_SIZES.len()];
            let long = n_q.max(n_k) >= 1000;
            short_cases += !long as usize;
            Case {
                dtype: dtypes[i % 3],
                schedule: if (i / 3) % 2 == 0 {
                    Schedule::RowOwned
                } else {
                    Schedule::Paper
                },
                causal: (i / 2) % 2 == 1,
                head_dim: if long {
                    HEAD_DIMS[i % 4]
                } else {
                    HEAD_DIMS[short_cases % 8]
                },
                n_q,
                n_k,
                dropout: (i / 5) % 2 == 1,
                heads: if long { (2, 1) } else { heads[(i / 4) % 3] },
                lengths: LengthMode::ALL[(i / 7) % 3],
            }
        })
        .collect()
}

#[test]
fn matrix_against_the_f64_reference() {
    let Some(gpu) = gpu_or_skip("matrix_against_the_f64_reference") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(fresh_seed("matrix_against_the_f64_reference"));
    let worst = Mutex::new(std::collections::BTreeMap::<&str, f64>::new());
    let mut failures = vec![];
    let list = cases();
    // Every value of every axis appears.
    for d in HEAD_DIMS {
        assert!(list.iter().any(|c| c.head_dim == d), "head dim {d} missing");
    }
    for n in [1, 17, 97, 128, 1000, 4097] {
        assert!(
            list.iter().any(|c| c.n_q == n) && list.iter().any(|c| c.n_k == n),
            "length {n} missing"
        );
    }
    // Under racecheck (roughly 50x slower than memcheck here) the long cases would take hours;
    // `FLASH_ATTN_MATRIX_MAX_LEN` keeps the cases whose sequences are at most that long (every
    // dtype, schedule, mask, head dim, GQA, dropout and length mode still appears at 128).
    let max_len: u32 = std::env::var("FLASH_ATTN_MATRIX_MAX_LEN")
        .ok()
        .map(|v| {
            v.parse()
                .expect("FLASH_ATTN_MATRIX_MAX_LEN must be a length")
        })
        .unwrap_or(u32::MAX);
    let list: Vec<Case> = list
        .into_iter()
        .filter(|c| c.n_q.max(c.n_k) <= max_len)
        .collect();
    if max_len != u32::MAX {
        eprintln!(
            "FLASH_ATTN_MATRIX_MAX_LEN={max_len}: {} of {} cases",
            list.len(),
            cases().len()
        );
    }
    for case in &list {
        let (shape, options) = case.shape_and_options(&mut rng);
        let dt = case.dtype;
        let q = random(&mut rng, shape.q_elems(), dt);
        let k = random(&mut rng, shape.kv_elems(), dt);
        let v = random(&mut rng, shape.kv_elems(), dt);
        let d_o = random(&mut rng, shape.q_elems(), dt);
        let up = |x: &[f32]| DeviceTensor::from_f32(dt, x).unwrap();
        let (qd, kd, vd, dod) = (up(&q), up(&k), up(&v), up(&d_o));

        let fwd = flash_forward(&gpu, &shape, &qd, &kd, &vd, &options).unwrap();
        let grads = flash_backward(
            &gpu, &shape, &qd, &kd, &vd, &fwd.o, &fwd.lse, &dod, &options,
        )
        .unwrap();
        let reference = forward_f32(&shape, &q, &k, &v, &options.attention).unwrap();
        let ref_grads = backward_f32(&shape, &q, &k, &v, &d_o, &options.attention).unwrap();

        let errs = [
            ("o", rel_err(&fwd.o.to_f32().unwrap(), &reference.o)),
            ("lse", lse_err(&fwd.lse.to_vec().unwrap(), &reference.lse)),
            ("dq", rel_err(&grads.dq.to_f32().unwrap(), &ref_grads.dq)),
            ("dk", rel_err(&grads.dk.to_f32().unwrap(), &ref_grads.dk)),
            ("dv", rel_err(&grads.dv.to_f32().unwrap(), &ref_grads.dv)),
        ];
        let case_worst = errs.iter().map(|e| e.1).fold(0.0, worst_of);
        let mut w = worst.lock().unwrap();
        let entry = w.entry(dt.name()).or_insert(0.0);
        *entry = worst_of(*entry, case_worst);
        let line = format!(
            "{case:?} B=({},{}) fwd B=({},{}) bwd: {}",
            fwd.block_sizes.block_rows,
            fwd.block_sizes.block_cols,
            grads.block_sizes.block_rows,
            grads.block_sizes.block_cols,
            errs.iter()
                .map(|(n, e)| format!("{n} {e:.2e}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        eprintln!("{line}");
        if case_worst > bound(dt) {
            failures.push(line);
        }
    }
    for (dtype, e) in worst.lock().unwrap().iter() {
        eprintln!("worst relative error {dtype}: {e:.3e}");
    }
    assert!(
        failures.is_empty(),
        "cases over their bound:\n{}",
        failures.join("\n")
    );
}

#[test]
fn every_block_size_gives_the_same_result() {
    let Some(gpu) = gpu_or_skip("every_block_size_gives_the_same_result") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(fresh_seed("every_block_size_gives_the_same_result"));
    let shape = AttentionShape {
        batch: 1,
        n_q: 133,
        n_k: 77,
        heads_q: 2,
        heads_kv: 1,
        head_dim: 40,
    };
    let (q, k, v, d_o) = (
        random(&mut rng, shape.q_elems(), DType::F32),
        random(&mut rng, shape.kv_elems(), DType::F32),
        random(&mut rng, shape.kv_elems(), DType::F32),
        random(&mut rng, shape.q_elems(), DType::F32),
    );
    let up = |x: &[f32]| DeviceTensor::from_f32(DType::F32, x).unwrap();
    let attention = AttentionOptions::new().causal(true).dropout(0.3, 11, 2);
    let reference = forward_f32(&shape, &q, &k, &v, &attention).unwrap();
    let ref_grads = backward_f32(&shape, &q, &k, &v, &d_o, &attention).unwrap();
    for (br, bc) in [(1, 1), (3, 5), (16, 16), (64, 32), (133, 77), (100, 130)] {
        for schedule in [Schedule::RowOwned, Schedule::Paper] {
            let options = FlashOptions::new(attention.clone())
                .schedule(schedule)
                .block_sizes(br, bc);
            let f = flash_forward(&gpu, &shape, &up(&q), &up(&k), &up(&v), &options).unwrap();
            let g = flash_backward(
                &gpu,
                &shape,
                &up(&q),
                &up(&k),
                &up(&v),
                &f.o,
                &f.lse,
                &up(&d_o),
                &options,
            )
            .unwrap();
            let errs = [
                rel_err(&f.o.to_f32().unwrap(), &reference.o),
                rel_err(&g.dq.to_f32().unwrap(), &ref_grads.dq),
                rel_err(&g.dk.to_f32().unwrap(), &ref_grads.dk),
                rel_err(&g.dv.to_f32().unwrap(), &ref_grads.dv),
            ];
            eprintln!("B=({br},{bc}) {schedule:?}: {errs:?}");
            assert!(
                errs.iter().all(|&e| e < bound(DType::F32)),
                "B=({br},{bc}) {schedule:?}: {errs:?}"
            );
        }
    }
}

/// L = Σ O ∘ G, evaluated in f64 from the GPU's f32 O.
fn loss(
    gpu: &Gpu,
    shape: &AttentionShape,
    qkv: [&[f32]; 3],
    g: &[f32],
    options: &FlashOptions,
) -> f64 {
    let up = |x: &[f32]| DeviceTensor::from_f32(DType::F32, x).unwrap();
    let f = flash_forward(gpu, shape, &up(qkv[0]), &up(qkv[1]), &up(qkv[2]), options).unwrap();
    f.o.to_f32()
        .unwrap()
        .iter()
        .zip(g)
        .map(|(&o, &w)| o as f64 * w as f64)
        .sum()
}

#[test]
fn backward_matches_finite_differences_of_the_gpu_forward() {
    let Some(gpu) = gpu_or_skip("backward_matches_finite_differences_of_the_gpu_forward") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(fresh_seed(
        "backward_matches_finite_differences_of_the_gpu_forward",
    ));
    let shape = AttentionShape {
        batch: 1,
        n_q: 17,
        n_k: 23,
        heads_q: 2,
        heads_kv: 1,
        head_dim: 16,
    };
    let options = FlashOptions::new(AttentionOptions::new().causal(true).dropout(0.2, 5, 0));
    let mut t = [
        random(&mut rng, shape.q_elems(), DType::F32),
        random(&mut rng, shape.kv_elems(), DType::F32),
        random(&mut rng, shape.kv_elems(), DType::F32),
    ];
    let g = random(&mut rng, shape.q_elems(), DType::F32);
    let up = |x: &[f32]| DeviceTensor::from_f32(DType::F32, x).unwrap();
    let f = flash_forward(&gpu, &shape, &up(&t[0]), &up(&t[1]), &up(&t[2]), &options).unwrap();
    let grads = flash_backward(
        &gpu,
        &shape,
        &up(&t[0]),
        &up(&t[1]),
        &up(&t[2]),
        &f.o,
        &f.lse,
        &up(&g),
        &options,
    )
    .unwrap();
    let analytic = [
        grads.dq.to_f32().unwrap(),
        grads.dk.to_f32().unwrap(),
        grads.dv.to_f32().unwrap(),
    ];
    let eps = 1e-2f32;
    let mut worst = 0.0f64;
    for (which, name) in ["q", "k", "v"].iter().enumerate() {
        for _ in 0..12 {
            let idx = rng.gen_range(0..t[which].len());
            let x = t[which][idx];
            t[which][idx] = x + eps;
            let up_loss = loss(&gpu, &shape, [&t[0], &t[1], &t[2]], &g, &options);
            t[which][idx] = x - eps;
            let down_loss = loss(&gpu, &shape, [&t[0], &t[1], &t[2]], &g, &options);
            t[which][idx] = x;
            let fd = (up_loss - down_loss) / (2.0 * eps as f64);
            let a = analytic[which][idx] as f64;
            // f32 forward noise over ~500 terms / 2ε plus O(ε²) truncation.
            let tol = 2e-3 + 1e-2 * a.abs();
            worst = worst_of(worst, (fd - a).abs());
            assert!(
                (fd - a).abs() <= tol,
                "d{name}[{idx}]: finite difference {fd}, backward {a}"
            );
        }
    }
    eprintln!("finite differences: worst |fd − backward| = {worst:.2e}");
}

#[test]
fn deterministic_gradients_are_bitwise_identical() {
    let Some(gpu) = gpu_or_skip("deterministic_gradients_are_bitwise_identical") else {
        return;
    };
    let mut rng =
        StdRng::seed_from_u64(fresh_seed("deterministic_gradients_are_bitwise_identical"));
    let shape = AttentionShape {
        batch: 2,
        n_q: 300,
        n_k: 257,
        heads_q: 4,
        heads_kv: 2,
        head_dim: 64,
    };
    let up = |x: &[f32]| DeviceTensor::from_f32(DType::Bf16, x).unwrap();
    let t: Vec<DeviceTensor> = [
        shape.q_elems(),
        shape.kv_elems(),
        shape.kv_elems(),
        shape.q_elems(),
    ]
    .iter()
    .map(|&n| up(&random(&mut rng, n, DType::Bf16)))
    .collect();
    let options = FlashOptions::new(AttentionOptions::new().causal(true).dropout(0.1, 1, 2))
        .deterministic(true);
    let f = flash_forward(&gpu, &shape, &t[0], &t[1], &t[2], &options).unwrap();
    let run = |o: &FlashOptions| {
        let g = flash_backward(&gpu, &shape, &t[0], &t[1], &t[2], &f.o, &f.lse, &t[3], o).unwrap();
        [
            g.dq.to_bits16().unwrap(),
            g.dk.to_bits16().unwrap(),
            g.dv.to_bits16().unwrap(),
        ]
    };
    let first = run(&options);
    for _ in 0..3 {
        assert!(
            run(&options) == first,
            "deterministic backward changed between runs"
        );
    }
    // The atomics path computes the same gradients, up to the order of its additions.
    let atomic = run(&options.clone().deterministic(false));
    for (a, b) in atomic.iter().zip(&first) {
        let widen = |x: &[u16]| {
            x.iter()
                .map(|&h| DType::Bf16.widen16(h))
                .collect::<Vec<f32>>()
        };
        let reference: Vec<f64> = widen(b).iter().map(|&x| x as f64).collect();
        assert!(rel_err(&widen(a), &reference) < bound(DType::Bf16));
    }
}

/// Peak device memory in use during `f`, sampled from another thread sharing the context.
fn peak_used_during(gpu: &Gpu, f: impl FnOnce()) -> usize {
    let ctx = cust::context::legacy::CurrentContext::get_current().unwrap();
    let (free0, _) = gpu.memory_info().unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let done = done.clone();
        std::thread::spawn(move || {
            cust::context::legacy::CurrentContext::set_current(&ctx).unwrap();
            let mut min_free = usize::MAX;
            while !done.load(Ordering::Relaxed) {
                min_free = min_free.min(cust::memory::mem_get_info().unwrap().0);
            }
            min_free
        })
    };
    f();
    let (free1, _) = gpu.memory_info().unwrap();
    done.store(true, Ordering::Relaxed);
    let min_free = poller.join().unwrap().min(free1);
    free0.saturating_sub(min_free)
}

#[test]
fn device_memory_grows_linearly_with_n() {
    let Some(gpu) = gpu_or_skip("device_memory_grows_linearly_with_n") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(fresh_seed("device_memory_grows_linearly_with_n"));
    let mut rows = vec![];
    for n in [4096u32, 8192, 16384] {
        let shape = AttentionShape {
            batch: 1,
            n_q: n,
            n_k: n,
            heads_q: 1,
            heads_kv: 1,
            head_dim: 64,
        };
        let t: Vec<DeviceTensor> = (0..4)
            .map(|_| {
                DeviceTensor::from_f32(DType::F16, &random(&mut rng, shape.q_elems(), DType::F16))
                    .unwrap()
            })
            .collect();
        let options = FlashOptions::new(AttentionOptions::new()).schedule(Schedule::Paper);
        let fwd = peak_used_during(&gpu, || {
            flash_forward(&gpu, &shape, &t[0], &t[1], &t[2], &options).unwrap();
        });
        let f = flash_forward(&gpu, &shape, &t[0], &t[1], &t[2], &options).unwrap();
        let bwd = peak_used_during(&gpu, || {
            flash_backward(
                &gpu, &shape, &t[0], &t[1], &t[2], &f.o, &f.lse, &t[3], &options,
            )
            .unwrap();
        });
        let quadratic = n as usize * n as usize * 2;
        eprintln!(
            "N = {n}: peak extra device memory forward {fwd} B, backward {bwd} B (one f16 N×N matrix: {quadratic} B)"
        );
        rows.push((n as usize, fwd.max(bwd)));
    }
    // Linear: the call's extra memory is O(N·d) (O, LSE, f32 state, dQ accumulator: ≤ 32 bytes per
    // row-element here, with 2 MiB of allocation granularity of slack), far below one N×N matrix.
    for &(n, used) in &rows {
        let linear_budget = 32 * n * 64 + (16 << 20);
        assert!(
            used <= linear_budget,
            "N = {n}: {used} B exceeds the linear budget {linear_budget} B"
        );
    }
}

#[test]
fn inputs_that_cannot_run_are_refused_before_any_launch() {
    let Some(gpu) = gpu_or_skip("inputs_that_cannot_run_are_refused_before_any_launch") else {
        return;
    };
    let shape = AttentionShape {
        batch: 1,
        n_q: 4,
        n_k: 4,
        heads_q: 2,
        heads_kv: 1,
        head_dim: 512,
    };
    let t = DeviceTensor::from_f32(DType::F32, &vec![0.0; shape.q_elems()]).unwrap();
    let kv = DeviceTensor::from_f32(DType::F32, &vec![0.0; shape.kv_elems()]).unwrap();
    let refused = |r: flash_attn::Result<_>| matches!(r, Err(AttentionError::InvalidInput(_)));
    assert!(refused(
        flash_forward(&gpu, &shape, &t, &kv, &kv, &FlashOptions::default()).map(|_| ())
    ));
    let shape64 = AttentionShape {
        head_dim: 64,
        ..shape
    };
    let t64 = DeviceTensor::from_f32(DType::F32, &vec![0.0; shape64.q_elems()]).unwrap();
    assert!(refused(
        flash_forward(&gpu, &shape64, &t64, &t64, &t64, &FlashOptions::default()).map(|_| ())
    ));
    let kv64 = DeviceTensor::from_f32(DType::F32, &vec![0.0; shape64.kv_elems()]).unwrap();
    let too_big = FlashOptions::default().block_sizes(4096, 4096);
    assert!(refused(
        flash_forward(&gpu, &shape64, &t64, &kv64, &kv64, &too_big).map(|_| ())
    ));
    let bad_packed = FlashOptions::new(AttentionOptions::new().packed(vec![0, 5], vec![0, 4]));
    assert!(refused(
        flash_forward(&gpu, &shape64, &t64, &kv64, &kv64, &bad_packed).map(|_| ())
    ));
}
