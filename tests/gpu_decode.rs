//! The split-KV decode family against the f64 reference, bf16 and f16, head dims 64 and 128,
//! through `flash_attn::forward_into` (the plan must choose it on its own) into NaN-poisoned
//! outputs: GQA ratios 1, 2, 4, 8, 16; one split, several, and more splits than a short sequence
//! has key blocks (its trailing splits empty); ragged key lengths including 0 (empty rows: O = 0,
//! LSE = −∞); N_k not a multiple of the kernel's 64-key tile; N_q > 1 rows filling the 16-row tile
//! (GQA 8 × 2 rows, GQA 4 × 4 rows, 16 rows of one head), causal (rows above the bottom-right
//! diagonal empty) and not; NaN/∞ in K and V past a key length and at causally masked keys
//! (ignored), NaN and +∞ in V at keys every row sees, in the block of the causal diagonal (they
//! reach every row), and a NaN Q row (its O and LSE NaN); many splits of one K/V head. Every case
//! runs with every combine of the splits (`DecodeCombine`): the last split's merge in the kernel
//! (the default), the parallel combine and the strided merge. The expectations are the
//! reference's. One workspace reused by several calls on a stream gives the same bits each time
//! (the last split leaves its counters zero).
//!
//! Where no CUDA device answers, the test prints `SKIP` and returns.

use flash_attn::reference::forward_f32;
use flash_attn::{
    AttentionOptions, AttentionShape, DType, DecodeCombine, DeviceF32, DeviceTensor, Direction,
    Family, FlashOptions, TensorMut, TensorRef, Workspace, forward_on,
};
use flash_attn_testkit::caller_stream::{bits, poisoned, widen};
use flash_attn_testkit::testing::{fresh_seed, gpu_or_skip, lse_err, rel_err};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// As `tests/gpu_matrix.rs`: the output's rounding.
fn bound(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2e-3,
        _ => 1e-2,
    }
}

struct Case {
    shape: AttentionShape,
    causal: bool,
    key_lengths: Option<Vec<u32>>,
    /// Poison K/V past the key lengths and Q row 0 of item 0, head 0.
    non_finite: bool,
}

fn case(batch: u32, n_q: u32, n_k: u32, hq: u32, hkv: u32, d: u32) -> Case {
    Case {
        shape: AttentionShape {
            batch,
            n_q,
            n_k,
            heads_q: hq,
            heads_kv: hkv,
            head_dim: d,
            head_dim_v: d,
        },
        causal: false,
        key_lengths: None,
        non_finite: false,
    }
}

fn cases(rng: &mut StdRng, d: u32) -> Vec<Case> {
    let mut out = vec![];
    for group in [1, 2, 4, 8, 16] {
        // One decode step, N_k off the step; ragged lengths with an empty item.
        out.push(case(2, 1, 1000, 2 * group, 2, d));
        out.push(Case {
            key_lengths: Some(vec![0, rng.gen_range(1..=1000)]),
            ..case(2, 1, 1000, group, 1, d)
        });
    }
    // One split (few keys), many splits, a short item among long ones (more splits than its
    // key blocks), a single key.
    out.push(case(3, 1, 100, 8, 8, d));
    out.push(case(1, 1, 20_000, 32, 8, d));
    out.push(Case {
        key_lengths: Some(vec![5, 8192, 129]),
        ..case(3, 1, 8192, 8, 2, d)
    });
    out.push(case(1, 1, 1, 4, 1, d));
    // Many splits of one K/V head (on the H200: 125 of 5 tiles at d = 128, 209 of 3 at d = 64).
    out.push(case(1, 1, 40_000, 4, 1, d));
    // Several query rows per head filling the 16-row tile, without the causal mask.
    out.push(case(2, 2, 1000, 16, 2, d));
    out.push(Case {
        key_lengths: Some(vec![777, 64]),
        ..case(2, 4, 1000, 8, 2, d)
    });
    // Causal chunks: N_q > 1, bottom-right aligned; with a key length shorter than N_q the first
    // rows see nothing.
    out.push(Case {
        causal: true,
        ..case(2, 4, 777, 8, 2, d)
    });
    out.push(Case {
        causal: true,
        key_lengths: Some(vec![3, 777]),
        ..case(2, 4, 777, 8, 2, d)
    });
    out.push(Case {
        causal: true,
        ..case(1, 16, 300, 4, 4, d)
    });
    out.push(Case {
        causal: true,
        ..case(1, 4, 2000, 16, 4, d)
    });
    // Non-finite values where they must be ignored or must arrive, and one NaN row; 12 rows
    // and the full 16 (GQA 8 × 2 rows).
    out.push(Case {
        causal: true,
        key_lengths: Some(vec![300, 650]),
        non_finite: true,
        ..case(2, 3, 700, 4, 1, d)
    });
    out.push(Case {
        causal: true,
        key_lengths: Some(vec![129, 64]),
        non_finite: true,
        ..case(2, 2, 200, 16, 2, d)
    });
    out
}

#[test]
fn decode_matches_the_reference() {
    let Some(gpu) = gpu_or_skip("decode_matches_the_reference") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(fresh_seed("decode_matches_the_reference"));
    let mut failures = vec![];
    for dtype in [DType::Bf16, DType::F16] {
        for d in [64, 128] {
            for c in cases(&mut rng, d) {
                let s = c.shape;
                let draw = |rng: &mut StdRng, n| -> Vec<f32> {
                    (0..n)
                        .map(|_| dtype.round(rng.gen_range(-1.5f32..1.5)))
                        .collect()
                };
                let (mut q, mut k, mut v) = (
                    draw(&mut rng, s.q_elems()),
                    draw(&mut rng, s.k_elems()),
                    draw(&mut rng, s.v_elems()),
                );
                let mut options = AttentionOptions::new().causal(c.causal);
                if let Some(lens) = &c.key_lengths {
                    options = options.key_lengths(lens.clone());
                }
                if c.non_finite {
                    let lens = c.key_lengths.as_ref().unwrap();
                    let row = (s.heads_kv * s.head_dim) as usize;
                    let poisons = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
                    for b in 0..s.batch as usize {
                        let item = b * s.n_k as usize * row;
                        // Past the key length: nobody sees these.
                        for (x, i) in k[item + lens[b] as usize * row..item + s.n_k as usize * row]
                            .iter_mut()
                            .zip(0..)
                        {
                            *x = poisons[i % 3];
                        }
                        for x in &mut v[item + lens[b] as usize * row..item + s.n_k as usize * row]
                        {
                            *x = f32::NAN;
                        }
                        // The last key only the last causal row sees, in V: NaN reaches that
                        // row's O (allowed there) and no other row.
                        let last = item + (lens[b] as usize - 1) * row;
                        v[last] = f32::NAN;
                        // A key every row sees, in the same block (the causal diagonal's): NaN
                        // and +∞ reach every row of the K/V head's group in their columns.
                        let seen = item + (lens[b] - s.n_q) as usize * row;
                        v[seen + 1] = f32::NAN;
                        v[seen + 2] = f32::INFINITY;
                    }
                    q[..s.head_dim as usize].fill(f32::NAN);
                }
                let want = forward_f32(&s, &q, &k, &v, &options).unwrap();
                let up = |x: &[f32]| DeviceTensor::from_f32(dtype, x).unwrap();
                let (qd, kd, vd) = (up(&q), up(&k), up(&v));
                for combine in DecodeCombine::ALL {
                    let o = DeviceTensor::poisoned(dtype, s.o_elems()).unwrap();
                    let lse = DeviceF32::poisoned(s.row_elems()).unwrap();
                    let flash = FlashOptions::new(options.clone()).decode_combine(combine);
                    let plan = flash_attn::forward_into(&gpu, &s, &qd, &kd, &vd, &o, &lse, &flash)
                        .unwrap();
                    gpu.synchronize().unwrap();
                    assert_eq!(plan.family, Family::Decode, "{s:?}: {plan}");
                    let (eo, el) = (
                        rel_err(&o.to_f32().unwrap(), &want.o),
                        lse_err(&lse.to_vec().unwrap(), &want.lse),
                    );
                    let name = format!(
                        "{dtype} {s:?} causal {} lengths {:?} non-finite {} splits {} {combine:?}",
                        c.causal, c.key_lengths, c.non_finite, plan.grid.0
                    );
                    println!("{name}: O rel {eo:.2e}, LSE abs {el:.2e}");
                    if eo > bound(dtype) || el > 1e-3 {
                        failures.push(format!("{name}: O {eo:.2e} LSE {el:.2e}"));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "cases over their bound:\n{}",
        failures.join("\n")
    );
}

/// One workspace through several calls on a caller's stream: the last split of each (K/V head,
/// sequence) resets its counter, so every call merges again (a counter left behind would leave
/// the poisoned O in place) and gives the first call's bits, within the bound of the reference.
#[test]
fn last_split_counters_are_left_zero_for_the_next_call() {
    let test = "last_split_counters_are_left_zero_for_the_next_call";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let stream = gpu.context().new_stream().unwrap();
    let mut rng = StdRng::seed_from_u64(fresh_seed(test));
    for s in [case(2, 1, 9000, 32, 8, 128), case(1, 3, 5000, 16, 4, 64)] {
        let s = s.shape;
        let draw = |rng: &mut StdRng, n| -> Vec<bf16> {
            (0..n)
                .map(|_| bf16::from_f32(rng.gen_range(-1.5f32..1.5)))
                .collect()
        };
        let (q, k, v) = (
            draw(&mut rng, s.q_elems()),
            draw(&mut rng, s.k_elems()),
            draw(&mut rng, s.v_elems()),
        );
        let options = FlashOptions::default();
        let plan = flash_attn::plan(&gpu, &s, DType::Bf16, &options, Direction::Forward).unwrap();
        assert_eq!(plan.family, Family::Decode, "{s:?}: {plan}");
        assert!(plan.grid.0 > 1, "{s:?} runs one split: {plan}");
        let want = forward_f32(&s, &widen(&q), &widen(&k), &widen(&v), &options.attention).unwrap();
        let (dq, dk, dv) = (
            stream.clone_htod(&q).unwrap(),
            stream.clone_htod(&k).unwrap(),
            stream.clone_htod(&v).unwrap(),
        );
        let workspace = Workspace::on_stream(&gpu, &plan, &stream).unwrap();
        let mut first: Option<(Vec<u16>, Vec<u32>)> = None;
        for call in 0..3 {
            let mut o = poisoned(&stream, bf16::NAN, s.o_elems());
            let mut lse = poisoned(&stream, f32::NAN, s.row_elems());
            let views = [&dq, &dk, &dv].map(|x| TensorRef::new(x, &stream));
            forward_on(
                &gpu,
                &stream,
                &s,
                [&views[0], &views[1], &views[2]],
                &mut TensorMut::new(&mut o, &stream),
                &mut TensorMut::new(&mut lse, &stream),
                &workspace,
                &options,
            )
            .unwrap();
            let (o, lse) = (
                stream.clone_dtoh(&o).unwrap(),
                stream.clone_dtoh(&lse).unwrap(),
            );
            let (eo, el) = (rel_err(&widen(&o), &want.o), lse_err(&lse, &want.lse));
            println!(
                "{s:?} call {call}, {} splits: O rel {eo:.2e}, LSE abs {el:.2e}",
                plan.grid.0
            );
            assert!(eo <= bound(DType::Bf16) && el <= 1e-3, "{s:?} call {call}");
            let got = (bits(&o), lse.iter().map(|x| x.to_bits()).collect());
            match &first {
                None => first = Some(got),
                Some(f) => assert!(*f == got, "{s:?}: call {call} differs from call 0"),
            }
        }
    }
}
