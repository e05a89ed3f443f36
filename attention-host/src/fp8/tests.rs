use super::*;
use crate::error::AttentionError;
use crate::options::AttentionOptions;

const HOPPER: (u32, u32) = (9, 0);

fn plain(causal: bool) -> FlashOptions {
    FlashOptions::new(AttentionOptions::new().causal(causal))
}

fn refused(r: Result<Fp8Config>, says: &str) {
    match r {
        Err(AttentionError::InvalidInput(why)) => assert!(why.contains(says), "{why}"),
        other => panic!("expected InvalidInput saying {says:?}, got {other:?}"),
    }
}

#[test]
fn check_takes_plain_calls_at_d128_on_hopper() {
    let shape = AttentionShape::new(2, 300, 500, 8, 2, 128);
    let descale = Fp8Descale::per_tensor(&shape, 0.5, 0.25, 2.0);
    for causal in [false, true] {
        let c = check(HOPPER, true, &shape, &descale, &plain(causal)).unwrap();
        assert_eq!(c, attention_kernels::kernels::sm90::FP8_D128);
        assert_eq!(c.threads(), 384);
        assert!(c.shared_bytes() <= 227 * 1024);
    }
    let sm90 = plain(true).kernel(KernelChoice::Only(Family::Sm90));
    assert!(check(HOPPER, true, &shape, &descale, &sm90).is_ok());
}

/// Past 65,535 sequences the launch folds the (head, sequence) pairs onto y and z as every
/// family's does, which the kernel decodes with `attn::grid::head_and_sequence`.
#[test]
fn launch_folds_pairs_past_the_grid_limit() {
    for (batch, heads, want) in [(3, 8, (1, 8, 3)), (70_000, 1, (1, 65_535, 2))] {
        let shape = AttentionShape::new(batch, 100, 100, heads, 1, 128);
        let descale = Fp8Descale::per_tensor(&shape, 1.0, 1.0, 1.0);
        let (config, problem) = checked(HOPPER, true, &shape, &descale, &plain(true)).unwrap();
        let launch = launch_config(&config, &problem, &shape);
        assert_eq!(launch.grid, want, "batch {batch}, heads {heads}");
        assert_eq!(launch.block, (384, 1, 1));
    }
}

#[test]
fn check_refuses_devices_without_fp8_or_wgmma() {
    let shape = AttentionShape::new(1, 64, 64, 2, 2, 128);
    let descale = Fp8Descale::per_tensor(&shape, 1.0, 1.0, 1.0);
    let o = plain(false);
    refused(check((8, 0), false, &shape, &descale, &o), "8.9 or newer");
    refused(check((8, 6), false, &shape, &descale, &o), "8.9 or newer");
    refused(
        check((8, 9), false, &shape, &descale, &o),
        "wgmma family only",
    );
    refused(
        check((9, 0), false, &shape, &descale, &o),
        "wgmma family only",
    );
    refused(
        check((10, 0), false, &shape, &descale, &o),
        "wgmma family only",
    );
    for family in [Family::Sm80, Family::Exact, Family::Decode] {
        let only = plain(false).kernel(KernelChoice::Only(family));
        refused(check(HOPPER, true, &shape, &descale, &only), "no FP8");
    }
}

#[test]
fn check_refuses_what_the_kernel_does_not_take() {
    let shape = AttentionShape::new(1, 64, 64, 2, 1, 128);
    let descale = Fp8Descale::per_tensor(&shape, 1.0, 1.0, 1.0);
    let refuse_option = |a: AttentionOptions| {
        refused(
            check(HOPPER, true, &shape, &descale, &FlashOptions::new(a)),
            "full-length",
        )
    };
    refuse_option(AttentionOptions::new().dropout(0.1, 1, 0));
    refuse_option(AttentionOptions::new().window(8, 0));
    refuse_option(AttentionOptions::new().softcap(30.0));
    refuse_option(AttentionOptions::new().key_lengths(vec![10]));
    for d in [64, 96, 256] {
        let shape = AttentionShape::new(1, 64, 64, 2, 1, d);
        let descale = Fp8Descale::per_tensor(&shape, 1.0, 1.0, 1.0);
        refused(
            check(HOPPER, true, &shape, &descale, &plain(false)),
            "head dim 128",
        );
    }
    let mut short = descale.clone();
    short.q.pop();
    refused(
        check(HOPPER, true, &shape, &short, &plain(false)),
        "one per head",
    );
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let mut d = descale.clone();
        d.v[0] = bad;
        refused(
            check(HOPPER, true, &shape, &d, &plain(false)),
            "finite and positive",
        );
    }
    // The shape's own validation still runs (heads_q not a multiple of heads_kv).
    let odd = AttentionShape::new(1, 64, 64, 3, 2, 128);
    let d = Fp8Descale::per_tensor(&odd, 1.0, 1.0, 1.0);
    assert!(matches!(
        check(HOPPER, true, &odd, &d, &plain(false)),
        Err(AttentionError::InvalidInput(_))
    ));
}

#[test]
fn quantize_per_head_scales_each_head_to_the_e4m3_range() {
    let (heads, d) = (2u32, 4u32);
    // Head 0 spans ±3, head 1 ±0.01.
    let x = [
        1.0, -3.0, 0.5, 2.0, 0.01, -0.005, 0.0, 0.002, -1.5, 3.0, 0.1, 0.0, 0.0, 0.01, -0.01, 0.0,
    ];
    let (bits, factors) = quantize_per_head(&x, heads, d);
    assert_eq!(factors, vec![3.0 / 448.0, 0.01 / 448.0]);
    assert_eq!(bits[1], 0xfe); // −3 is −448 · δ₀
    assert_eq!(bits[4], 0x7e);
    let back = dequantize(&bits, &factors, d);
    for (i, (&x, &y)) in x.iter().zip(&back).enumerate() {
        let amax = factors[(i / 4) % 2] as f64 * 448.0;
        // Half a step of e4m3 (2⁻⁴ relative) above its subnormals, whose step is 2⁻⁹ · δ.
        let bound = (x.abs() as f64 / 16.0).max(amax / 448.0 * 2f64.powi(-10));
        assert!((x as f64 - y).abs() <= bound * 1.0001, "{i}: {x} -> {y}");
    }
    let (zero_bits, zero_factors) = quantize_per_head(&[0.0; 8], 2, 4);
    assert_eq!(zero_factors, vec![1.0, 1.0]);
    assert!(zero_bits.iter().all(|&b| b == 0));
}

#[test]
fn reference_applies_each_heads_factors() {
    let shape = AttentionShape::new(1, 5, 7, 2, 2, 128);
    let bits = |n: usize, salt: usize| -> Vec<u8> {
        (0..n)
            .map(|i| e4m3::from_f32((((i * 7 + salt) % 23) as f32 - 11.0) / 4.0))
            .collect()
    };
    let (q, k, v) = (
        bits(shape.q_elems(), 1),
        bits(shape.k_elems(), 2),
        bits(shape.v_elems(), 3),
    );
    let base = Fp8Descale::per_tensor(&shape, 0.5, 0.25, 1.0);
    let options = plain(true);
    let r = reference(&shape, [&q, &k, &v], &base, &options).unwrap();
    // Doubling head 1's V factor doubles its O only; the LSE does not move.
    let mut v2 = base.clone();
    v2.v[1] = 2.0;
    let r2 = reference(&shape, [&q, &k, &v], &v2, &options).unwrap();
    let d = 128;
    for (i, (a, b)) in r.o.iter().zip(&r2.o).enumerate() {
        let head = (i / d) % 2;
        let want = if head == 1 { 2.0 * a } else { *a };
        assert!(
            (b - want).abs() <= 1e-12 * want.abs().max(1.0),
            "{i}: {b} vs {want}"
        );
    }
    assert_eq!(r.lse, r2.lse);
    // Q's and K's factors multiply the scores: δ_Q δ_K = 1/8 equals τ · 1/8 on unscaled inputs.
    let unit = Fp8Descale::per_tensor(&shape, 1.0, 1.0, 1.0);
    let tau = 1.0 / (128f32).sqrt();
    let scaled = FlashOptions::new(AttentionOptions::new().causal(true).scale(tau / 8.0));
    let r3 = reference(&shape, [&q, &k, &v], &unit, &scaled).unwrap();
    for (a, b) in r.o.iter().zip(&r3.o) {
        assert!((a - b).abs() <= 1e-9 * a.abs().max(1.0), "{a} vs {b}");
    }
    // The dequantized inputs are the stored values times the factors, exactly.
    let dq = dequantize(&q, &base.q, 128);
    assert_eq!(dq[3], e4m3::to_f32(q[3]) as f64 * 0.5);
}
