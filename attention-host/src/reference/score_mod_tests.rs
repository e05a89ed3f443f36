//! The window, softcap, ALiBi and sink logits of the reference against numbers computed by hand
//! (the article's five-key row) and against a brute-force softmax written from the options' doc.

use approx::assert_relative_eq;

use super::forward;
use super::test_support::inputs;
use crate::options::AttentionOptions;
use attention_kernels::abi::shape::AttentionShape;

/// The article's row: query `[1, 0]`, keys `[s_j, 0]` with `τ = 1` (scores exactly
/// `s = [0, −2, 3, 1, −1]`), values `v_j`; one query row, five keys, so the row's aligned
/// diagonal is key 4.
fn article_row(options: AttentionOptions) -> (Vec<f64>, f64) {
    let k: Vec<f64> = [0.0, -2.0, 3.0, 1.0, -1.0]
        .iter()
        .flat_map(|&s| [s, 0.0])
        .collect();
    let v = [1.0, 0.0, 0.0, 2.0, 4.0, 1.0, 2.0, 3.0, -1.0, 2.0];
    let out = forward(
        &AttentionShape::new(1, 1, 5, 1, 1, 2),
        &[1.0, 0.0],
        &k,
        &v,
        &options.scale(1.0),
    )
    .unwrap();
    (out.o, out.lse[0])
}

fn assert_row(got: (Vec<f64>, f64), o: [f64; 2], lse: f64) {
    assert_relative_eq!(got.0[..], o[..], epsilon = 1e-12, max_relative = 0.0);
    assert_relative_eq!(got.1, lse, epsilon = 1e-12, max_relative = 0.0);
}

#[test]
fn window_keeps_the_keys_left_of_the_diagonal() {
    // (2, 0): keys 2, 3, 4 (scores 3, 1, −1).
    let expected = ([3.68599794446527, 1.2504970956288637], 3.1429316284998996);
    assert_row(
        article_row(AttentionOptions::new().window(2, 0)),
        expected.0,
        expected.1,
    );
    assert_row(
        article_row(AttentionOptions::new().window(2, 7).causal(true)),
        expected.0,
        expected.1,
    );
}

#[test]
fn softcap_bends_the_scores() {
    // s' = 2·tanh(s / 2).
    assert_row(
        article_row(AttentionOptions::new().softcap(2.0)),
        [2.9366582290576635, 1.4542505067880818],
        2.326989699624156,
    );
}

#[test]
fn alibi_subtracts_the_distance_to_the_diagonal() {
    // Slope 0.5: biases −0.5·|4 − j| = [−2, −1.5, −1, −0.5, 0].
    assert_row(
        article_row(AttentionOptions::new().alibi_slopes(vec![0.5])),
        [3.4082621450558817, 1.3719688228031792],
        2.258757490056903,
    );
}

#[test]
fn sink_joins_the_denominator_only() {
    // LSE = ln(Σ e^s + e^1), O = Σ e^{s_j} v_j / (Σ e^s + e).
    assert_row(
        article_row(AttentionOptions::new().sinks(vec![1.0])),
        [3.197403284100254, 1.0822005785255744],
        3.2967740305992583,
    );
}

#[test]
fn a_row_with_no_allowed_key_has_the_sink_as_lse() {
    // n_q = 3, n_k = 1, causal: rows 0 and 1 see nothing.
    let s = AttentionShape::new(1, 3, 1, 2, 1, 2);
    let x = inputs(&s, 31);
    let options = AttentionOptions::new().causal(true).sinks(vec![0.75, -2.0]);
    let out = forward(&s, &x.q, &x.k, &x.v, &options).unwrap();
    // LSE is [batch, heads_q, n_q].
    assert_eq!(out.lse[0..2], [0.75, 0.75]);
    assert_eq!(out.lse[3..5], [-2.0, -2.0]);
    assert!(out.o[..8].iter().all(|&o| o == 0.0));
    assert!(out.o[8..].iter().all(|&o| o != 0.0 && o.is_finite()));
    // Without sinks the same rows are empty.
    let plain = forward(&s, &x.q, &x.k, &x.v, &AttentionOptions::new().causal(true)).unwrap();
    assert_eq!(plain.lse[0], f64::NEG_INFINITY);
}

/// Row `i` of each head by the options' doc: allowed keys
/// `i + n_k − n_q − left <= j <= i + n_k − n_q + right` (and causal), score
/// `c·tanh(τ q·k / c) − slope·|i + n_k − n_q − j|`, softmax with the sink.
fn brute_force(
    s: &attention_kernels::abi::shape::AttentionShape,
    x: &super::test_support::Inputs,
    o: &AttentionOptions,
) -> (Vec<f64>, Vec<f64>) {
    let d = s.head_dim as usize;
    let tau = o.scale_for(s.head_dim) as f64;
    let mut out = vec![0.0; s.o_elems()];
    let mut lse = vec![0.0; s.row_elems()];
    for h in 0..s.heads_q as usize {
        let g = s.kv_head(h as u32) as usize;
        for i in 0..s.n_q as i64 {
            let a = i + s.n_k as i64 - s.n_q as i64;
            let qo = (i as usize * s.heads_q as usize + h) * d;
            let mut terms = Vec::new();
            for j in 0..s.n_k as i64 {
                let w = o.window.unwrap();
                let allowed =
                    a - w.left as i64 <= j && j <= a + w.right as i64 && (!o.causal || j <= a);
                if !allowed {
                    continue;
                }
                let ko = (j as usize * s.heads_kv as usize + g) * d;
                let dot: f64 = (0..d).map(|c| x.q[qo + c] * x.k[ko + c]).sum();
                let c = o.softcap.unwrap() as f64;
                let slope = o.alibi_slopes.as_ref().unwrap()[h] as f64;
                terms.push((
                    c * (tau * dot / c).tanh() - slope * (a - j).abs() as f64,
                    ko,
                ));
            }
            let sink = o.sinks.as_ref().unwrap()[h] as f64;
            let z: f64 = terms.iter().map(|t| t.0.exp()).sum::<f64>() + sink.exp();
            lse[h * s.n_q as usize + i as usize] = z.ln();
            for (sc, ko) in terms {
                for c in 0..d {
                    out[qo + c] += sc.exp() / z * x.v[ko + c];
                }
            }
        }
    }
    (out, lse)
}

#[test]
fn every_modifier_together_matches_the_documented_formula() {
    for (n_q, n_k, causal, left, right) in [
        (7, 7, true, 2, 0),
        (5, 9, false, 1, 3),
        (9, 4, true, 0, 0),
        (6, 6, false, 100, 100),
    ] {
        let s = AttentionShape::new(1, n_q, n_k, 3, 1, 4);
        let x = inputs(&s, 40 + n_q as u64);
        let options = AttentionOptions::new()
            .causal(causal)
            .window(left, right)
            .softcap(1.5)
            .alibi_slopes(vec![0.5, 0.25, 0.125])
            .sinks(vec![0.3, -1.0, 2.0]);
        let out = forward(&s, &x.q, &x.k, &x.v, &options).unwrap();
        let (o, lse) = brute_force(&s, &x, &options);
        assert_relative_eq!(out.o[..], o[..], epsilon = 1e-12, max_relative = 0.0);
        assert_relative_eq!(out.lse[..], lse[..], epsilon = 1e-12, max_relative = 0.0);
    }
}

#[test]
fn windowed_out_keys_never_contribute() {
    let s = AttentionShape::new(1, 6, 6, 1, 1, 2);
    let x = inputs(&s, 50);
    let options = AttentionOptions::new().window(1, 1);
    let clean = forward(&s, &x.q, &x.k, &x.v, &options).unwrap();
    // Key 5 is outside the window of rows 0 to 3; a NaN there reaches rows 4 and 5 only.
    let (mut k, mut v) = (x.k.clone(), x.v.clone());
    k[10] = f64::NAN;
    v[11] = f64::INFINITY;
    let dirty = forward(&s, &x.q, &k, &v, &options).unwrap();
    assert_eq!(clean.o[..8], dirty.o[..8]);
    assert_eq!(clean.lse[..4], dirty.lse[..4]);
    assert!(dirty.lse[4].is_nan() && dirty.lse[5].is_nan());
}

#[test]
fn bad_modifiers_are_refused() {
    let s = AttentionShape::new(1, 2, 2, 2, 1, 2);
    let x = inputs(&s, 51);
    let refused = |o: AttentionOptions, what: &str| {
        let err = forward(&s, &x.q, &x.k, &x.v, &o).unwrap_err().to_string();
        assert!(err.contains(what), "{err}");
    };
    refused(AttentionOptions::new().softcap(0.0), "softcap");
    refused(AttentionOptions::new().softcap(f32::NAN), "softcap");
    refused(
        AttentionOptions::new().alibi_slopes(vec![1.0]),
        "alibi slopes",
    );
    refused(
        AttentionOptions::new().sinks(vec![0.0, f32::INFINITY]),
        "sinks must be finite",
    );
    refused(
        AttentionOptions::new().window(u32::MAX, u32::MAX),
        "bounds nothing",
    );
}

#[test]
fn standard_alibi_slopes() {
    use crate::options::alibi_slopes;
    assert_eq!(
        alibi_slopes(8),
        [
            0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625
        ]
    );
    // 12 heads: the 8-head schedule, then 2^(−0.5·k) for k = 1, 3, 5, 7.
    let s = alibi_slopes(12);
    assert_eq!(s.len(), 12);
    assert_eq!(s[..8], alibi_slopes(8)[..]);
    for (n, k) in [1, 3, 5, 7].into_iter().enumerate() {
        assert!((s[8 + n] as f64 - 2f64.powf(-0.5 * k as f64)).abs() < 1e-7);
    }
}
