//! The public merge of `(O, LSE)` parts (`flash_attn::merge`) against the f64 reference merge
//! (`flash_attn::reference::merge`), f32, f16 and bf16, into NaN-poisoned outputs:
//! - random parts with empty rows (`LSE = −∞`, their O NaN so a read shows), rows empty in every
//!   part, and a NaN LSE; 1, 2, 5 and 32 parts; head dims 8, 64, 128, 200;
//! - end to end: the library's forward over three key ranges, merged, against the reference
//!   forward over all keys;
//! - refusals: mismatched counts, shapes, dtypes, too many parts, outputs aliasing a part.
//!
//! Where no CUDA device answers, the test prints `SKIP` and returns.

use flash_attn::reference::{self, Part};
use flash_attn::{
    AttentionOptions, AttentionShape, DType, DeviceF32, DeviceTensor, FlashOptions, Gpu, PartShape,
    merge, merge_into,
};
use flash_attn_testkit::testing::{fresh_seed, gpu_or_skip, lse_err, rel_err};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Bound on ‖O − ref‖/‖ref‖: the output's rounding (f32: the hardware exp/log, ~1e-6).
fn o_bound(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-5,
        DType::F16 => 2e-3,
        DType::Bf16 => 1e-2,
    }
}

/// Parts with random O in the dtype and LSE in [−4, 4]: per row, part `p` is empty with
/// probability 1/4 (its O NaN), every part of row 0 is empty, and row 1 of part 0 has a NaN LSE.
fn random_parts(
    rng: &mut StdRng,
    s: &PartShape,
    parts: usize,
    dtype: DType,
) -> Vec<(Vec<f32>, Vec<f32>)> {
    let (o_elems, rows) = (s.o_elems().unwrap(), s.lse_elems().unwrap());
    let d = s.head_dim as usize;
    (0..parts)
        .map(|p| {
            let mut o: Vec<f32> = (0..o_elems)
                .map(|_| dtype.round(rng.gen_range(-1.0f32..1.0)))
                .collect();
            let mut lse: Vec<f32> = (0..rows).map(|_| rng.gen_range(-4.0f32..4.0)).collect();
            for (l, row) in lse.iter_mut().enumerate() {
                if row_of_lse(s, l) == 0 || rng.gen_range(0..4) == 0 {
                    *row = f32::NEG_INFINITY;
                    let r = row_of_lse(s, l);
                    o[r * d..(r + 1) * d].fill(f32::NAN);
                }
            }
            if p == 0 && rows > 1 {
                lse[1] = f32::NAN;
            }
            (o, lse)
        })
        .collect()
}

/// The O row (`(b·n_q + i)·heads + h`) of LSE index `(b·heads + h)·n_q + i`.
fn row_of_lse(s: &PartShape, l: usize) -> usize {
    let (n_q, heads) = (s.n_q as usize, s.heads as usize);
    let (bh, i) = (l / n_q, l % n_q);
    let (b, h) = (bh / heads, bh % heads);
    (b * n_q + i) * heads + h
}

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

fn check_random(gpu: &Gpu, rng: &mut StdRng, s: PartShape, parts: usize, dtype: DType) {
    let host = random_parts(rng, &s, parts, dtype);
    let wide: Vec<(Vec<f64>, Vec<f64>)> = host.iter().map(|(o, l)| (widen(o), widen(l))).collect();
    let refs: Vec<Part> = wide.iter().map(|(o, lse)| Part { o, lse }).collect();
    let want = reference::merge(&s, &refs).unwrap();
    let dev: Vec<(DeviceTensor, DeviceF32)> = host
        .iter()
        .map(|(o, l)| {
            (
                DeviceTensor::from_f32(dtype, o).unwrap(),
                DeviceF32::from_slice(l).unwrap(),
            )
        })
        .collect();
    let o_parts: Vec<&DeviceTensor> = dev.iter().map(|p| &p.0).collect();
    let lse_parts: Vec<&DeviceF32> = dev.iter().map(|p| &p.1).collect();
    let o = DeviceTensor::poisoned(dtype, s.o_elems().unwrap()).unwrap();
    let lse = DeviceF32::poisoned(s.lse_elems().unwrap()).unwrap();
    merge_into(gpu, &s, &o_parts, &lse_parts, &o, &lse).unwrap();
    gpu.synchronize().unwrap();
    let (got_o, got_lse) = (o.to_f32().unwrap(), lse.to_vec().unwrap());
    let (eo, el) = (rel_err(&got_o, &want.o), lse_err(&got_lse, &want.lse));
    println!("merge {dtype} {s:?} parts {parts}: O rel {eo:.2e}, LSE abs {el:.2e}");
    assert!(eo <= o_bound(dtype), "{dtype} {s:?} {parts} parts: O {eo}");
    assert!(el <= 1e-5, "{dtype} {s:?} {parts} parts: LSE {el}");
    // Rows empty in every part are exactly O = 0, LSE = −∞.
    let d = s.head_dim as usize;
    assert!(got_o[..d].iter().all(|&x| x == 0.0));
    assert_eq!(got_lse[0], f32::NEG_INFINITY);
    // The same call through `merge` (allocating, waiting) gives the same bits.
    let m = merge(gpu, &s, &o_parts, &lse_parts).unwrap();
    assert_eq!(m.o.to_f32().unwrap().len(), got_o.len());
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(same(&m.o.to_f32().unwrap(), &got_o));
    assert!(same(&m.lse.to_vec().unwrap(), &got_lse));
}

#[test]
fn merge_matches_the_reference_merge() {
    let Some(gpu) = gpu_or_skip("merge_matches_the_reference_merge") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(fresh_seed("merge_matches_the_reference_merge"));
    for dtype in [DType::F32, DType::F16, DType::Bf16] {
        for (s, parts) in [
            ((2, 3, 4, 64), 2),
            ((1, 1, 32, 128), 5),
            ((3, 7, 2, 8), 1),
            ((1, 5, 3, 200), 32),
            ((4, 1, 8, 128), 3),
        ] {
            let s = PartShape {
                batch: s.0,
                n_q: s.1,
                heads: s.2,
                head_dim: s.3,
            };
            check_random(&gpu, &mut rng, s, parts, dtype);
        }
    }
}

/// K or V keys `keys` of every batch item of `x` (`[batch, n_k, heads_kv, d]`).
fn key_slice(s: &AttentionShape, x: &[f32], keys: std::ops::Range<u32>) -> Vec<f32> {
    let row = (s.heads_kv * s.head_dim) as usize;
    (0..s.batch as usize)
        .flat_map(|b| {
            let first = (b * s.n_k as usize + keys.start as usize) * row;
            x[first..first + keys.len() * row].to_vec()
        })
        .collect()
}

#[test]
fn forwards_over_key_ranges_merge_into_the_forward_over_all_keys() {
    let test = "forwards_over_key_ranges_merge_into_the_forward_over_all_keys";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(fresh_seed(test));
    let s = AttentionShape {
        batch: 2,
        n_q: 5,
        n_k: 300,
        heads_q: 8,
        heads_kv: 2,
        head_dim: 128,
        head_dim_v: 128,
    };
    for dtype in [DType::F32, DType::Bf16] {
        let draw = |rng: &mut StdRng, n| -> Vec<f32> {
            (0..n)
                .map(|_| dtype.round(rng.gen_range(-1.0f32..1.0)))
                .collect()
        };
        let (q, k, v) = (
            draw(&mut rng, s.q_elems()),
            draw(&mut rng, s.k_elems()),
            draw(&mut rng, s.v_elems()),
        );
        let want = reference::forward_f32(&s, &q, &k, &v, &AttentionOptions::new()).unwrap();
        let q_dev = DeviceTensor::from_f32(dtype, &q).unwrap();
        let pieces: Vec<_> = [0..1, 1..170, 170..300]
            .into_iter()
            .map(|keys| {
                let sub = AttentionShape {
                    n_k: keys.len() as u32,
                    ..s
                };
                let k_dev =
                    DeviceTensor::from_f32(dtype, &key_slice(&s, &k, keys.clone())).unwrap();
                let v_dev = DeviceTensor::from_f32(dtype, &key_slice(&s, &v, keys)).unwrap();
                flash_attn::forward(&gpu, &sub, &q_dev, &k_dev, &v_dev, &FlashOptions::default())
                    .unwrap()
            })
            .collect();
        let o_parts: Vec<&DeviceTensor> = pieces.iter().map(|p| &p.o).collect();
        let lse_parts: Vec<&DeviceF32> = pieces.iter().map(|p| &p.lse).collect();
        let m = merge(&gpu, &PartShape::of(&s), &o_parts, &lse_parts).unwrap();
        let (eo, el) = (
            rel_err(&m.o.to_f32().unwrap(), &want.o),
            lse_err(&m.lse.to_vec().unwrap(), &want.lse),
        );
        println!("forward x3 + merge {dtype}: O rel {eo:.2e}, LSE abs {el:.2e}");
        assert!(eo <= o_bound(dtype) * 2.0, "{dtype}: O {eo}");
        assert!(el <= 1e-4, "{dtype}: LSE {el}");
    }
}

#[test]
fn merge_refuses_bad_parts_before_launching() {
    let Some(gpu) = gpu_or_skip("merge_refuses_bad_parts_before_launching") else {
        return;
    };
    let s = PartShape {
        batch: 1,
        n_q: 2,
        heads: 2,
        head_dim: 8,
    };
    let o = |dtype, n| DeviceTensor::from_f32(dtype, &vec![0.5; n]).unwrap();
    let lse = |n| DeviceF32::from_slice(&vec![0.0; n]).unwrap();
    let (a, b, bad_o, f16) = (
        o(DType::Bf16, 32),
        o(DType::Bf16, 32),
        o(DType::Bf16, 31),
        o(DType::F16, 32),
    );
    let (la, lb, bad_l) = (lse(4), lse(4), lse(5));
    let refused = |o_parts: &[&DeviceTensor], lse_parts: &[&DeviceF32], what: &str| {
        let e = merge(&gpu, &s, o_parts, lse_parts)
            .err()
            .expect(what)
            .to_string();
        assert!(e.contains(what), "{e}");
    };
    refused(&[&a, &b], &[&la], "2 O parts but 1 LSE parts");
    refused(&[], &[], "1 to 32 parts");
    refused(&[&a, &bad_o], &[&la, &lb], "O part 1 holds 31");
    refused(&[&a, &b], &[&la, &bad_l], "LSE part 1 holds 5");
    refused(&[&a, &f16], &[&la, &lb], "O part 1 is f16");
    let many_o = vec![&a; 33];
    let many_l = vec![&la; 33];
    refused(&many_o, &many_l, "1 to 32 parts");
    let e = merge_into(&gpu, &s, &[&a, &b], &[&la, &lb], &a, &lse(4)).unwrap_err();
    assert!(
        e.to_string().contains("must not be one of its parts"),
        "{e}"
    );
    let e = merge_into(&gpu, &s, &[&a, &b], &[&la, &lb], &f16, &lse(4)).unwrap_err();
    assert!(e.to_string().contains("o must be bf16"), "{e}");
    let zero = PartShape { n_q: 0, ..s };
    let e = merge(&gpu, &zero, &[&a], &[&la]).err().unwrap();
    assert!(e.to_string().contains("n_q must be at least 1"), "{e}");
}
