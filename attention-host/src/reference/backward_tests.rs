use super::*;
use crate::reference::forward;
use crate::reference::test_support::{Inputs, inputs};
use approx::assert_relative_eq;

/// `⟨dO, O(q, k, v)⟩`, the scalar whose gradient `backward` returns.
fn loss(s: &AttentionShape, x: &Inputs, options: &AttentionOptions) -> f64 {
    let out = forward(s, &x.q, &x.k, &x.v, options).unwrap();
    out.o.iter().zip(&x.d_o).map(|(o, g)| o * g).sum()
}

/// Central differences of the loss in every element of Q, K and V against the analytic gradients.
fn check_by_finite_differences(s: &AttentionShape, options: &AttentionOptions, seed: u64) {
    let x = inputs(s, seed);
    let grads = backward(s, &x.q, &x.k, &x.v, &x.d_o, options).unwrap();
    let h = 1e-5;
    let numeric = |pick: fn(&mut Inputs) -> &mut Vec<f64>, len: usize| -> Vec<f64> {
        (0..len)
            .map(|i| {
                let mut plus = inputs(s, seed);
                pick(&mut plus)[i] += h;
                let mut minus = inputs(s, seed);
                pick(&mut minus)[i] -= h;
                (loss(s, &plus, options) - loss(s, &minus, options)) / (2.0 * h)
            })
            .collect()
    };
    assert_relative_eq!(
        grads.dq[..],
        numeric(|x| &mut x.q, s.q_elems())[..],
        epsilon = 1e-8,
        max_relative = 0.0
    );
    assert_relative_eq!(
        grads.dk[..],
        numeric(|x| &mut x.k, s.k_elems())[..],
        epsilon = 1e-8,
        max_relative = 0.0
    );
    assert_relative_eq!(
        grads.dv[..],
        numeric(|x| &mut x.v, s.v_elems())[..],
        epsilon = 1e-8,
        max_relative = 0.0
    );
}

#[test]
fn finite_differences_plain_and_scaled() {
    check_by_finite_differences(
        &AttentionShape::new(2, 3, 4, 2, 2, 3),
        &AttentionOptions::new(),
        11,
    );
    check_by_finite_differences(
        &AttentionShape::new(1, 4, 3, 1, 1, 2),
        &AttentionOptions::new().scale(1.7),
        12,
    );
}

#[test]
fn finite_differences_causal_with_unequal_lengths() {
    check_by_finite_differences(
        &AttentionShape::new(1, 5, 3, 2, 1, 2),
        &AttentionOptions::new().causal(true),
        13,
    );
    check_by_finite_differences(
        &AttentionShape::new(2, 3, 5, 2, 2, 3),
        &AttentionOptions::new().causal(true),
        14,
    );
}

#[test]
fn finite_differences_gqa_key_lengths_and_packed() {
    check_by_finite_differences(
        &AttentionShape::new(2, 3, 4, 4, 2, 2),
        &AttentionOptions::new().key_lengths(vec![2, 4]),
        15,
    );
    check_by_finite_differences(
        &AttentionShape::new(1, 5, 6, 3, 1, 2),
        &AttentionOptions::new()
            .causal(true)
            .packed(vec![0, 2, 5], vec![0, 4, 6]),
        16,
    );
}

#[test]
fn finite_differences_with_dropout_replayed() {
    check_by_finite_differences(
        &AttentionShape::new(2, 4, 5, 2, 1, 3),
        &AttentionOptions::new().dropout(0.3, 9, 2),
        17,
    );
    check_by_finite_differences(
        &AttentionShape::new(1, 6, 6, 2, 2, 2),
        &AttentionOptions::new()
            .causal(true)
            .dropout(0.5, 1, 0)
            .packed(vec![0, 4, 6], vec![0, 3, 6]),
        18,
    );
}

/// 0x0DD's structure: a key no row may see gets zero dK and dV; a row with no key gets zero dQ.
#[test]
fn unused_keys_and_empty_rows_have_zero_gradients() {
    let s = AttentionShape::new(1, 4, 5, 1, 1, 3);
    let x = inputs(&s, 19);
    let options = AttentionOptions::new()
        .causal(true)
        .key_lengths(vec![4])
        .dropout(0.2, 3, 3);
    let g = backward(&s, &x.q, &x.k, &x.v, &x.d_o, &options).unwrap();
    assert_eq!(&g.dk[12..], &[0.0; 3]);
    assert_eq!(&g.dv[12..], &[0.0; 3]);
    assert!(g.dq.iter().chain(&g.dk).chain(&g.dv).all(|v| v.is_finite()));
    assert!(g.dk[..12].iter().any(|v| *v != 0.0));

    let past = AttentionShape::new(1, 4, 2, 1, 1, 3);
    let y = inputs(&past, 20);
    let g = backward(
        &past,
        &y.q,
        &y.k,
        &y.v,
        &y.d_o,
        &AttentionOptions::new().causal(true),
    )
    .unwrap();
    assert_eq!(&g.dq[..6], &[0.0; 6], "rows 0 and 1 see no key");
    // Row 2 sees one key: its probability is 1 whatever the score, so dQ is exactly zero.
    assert_eq!(&g.dq[6..9], &[0.0; 3]);
    assert!(g.dq[9..].iter().all(|v| *v != 0.0 && v.is_finite()));
}

#[test]
fn gqa_gradients_sum_over_the_group() {
    let gqa = AttentionShape::new(1, 3, 4, 4, 2, 2);
    let x = inputs(&gqa, 21);
    let mha = AttentionShape { heads_kv: 4, ..gqa };
    let repeat =
        |t: &[f64]| -> Vec<f64> { t.chunks(2).flat_map(|head| [head; 2].concat()).collect() };
    let options = AttentionOptions::new().causal(true);
    let a = backward(&gqa, &x.q, &x.k, &x.v, &x.d_o, &options).unwrap();
    let b = backward(&mha, &x.q, &repeat(&x.k), &repeat(&x.v), &x.d_o, &options).unwrap();
    assert_relative_eq!(a.dq[..], b.dq[..], epsilon = 1e-15, max_relative = 0.0);
    let fold = |t: &[f64]| -> Vec<f64> {
        t.chunks(4)
            .flat_map(|pair| [pair[0] + pair[2], pair[1] + pair[3]])
            .collect()
    };
    assert_relative_eq!(
        a.dk[..],
        fold(&b.dk)[..],
        epsilon = 1e-15,
        max_relative = 0.0
    );
    assert_relative_eq!(
        a.dv[..],
        fold(&b.dv)[..],
        epsilon = 1e-15,
        max_relative = 0.0
    );
}

#[test]
fn nan_input_poisons_only_its_row_gradients() {
    let s = AttentionShape::new(1, 2, 2, 1, 1, 1);
    let g = backward(
        &s,
        &[1.0, f64::NAN],
        &[0.5, -0.5],
        &[1.0, 2.0],
        &[1.0, 1.0],
        &AttentionOptions::new(),
    )
    .unwrap();
    assert!(g.dq[0].is_finite() && g.dq[1].is_nan());
    assert!(g.dk.iter().chain(&g.dv).all(|v| v.is_nan()));
}

#[test]
fn d_o_length_is_checked() {
    let s = AttentionShape::new(1, 2, 2, 1, 1, 1);
    assert!(
        backward(
            &s,
            &[1.0; 2],
            &[1.0; 2],
            &[1.0; 2],
            &[1.0; 3],
            &AttentionOptions::new()
        )
        .is_err()
    );
}

#[test]
fn finite_differences_window_softcap_and_alibi() {
    check_by_finite_differences(
        &AttentionShape::new(1, 5, 6, 2, 1, 3),
        &AttentionOptions::new().causal(true).window(2, 0),
        60,
    );
    check_by_finite_differences(
        &AttentionShape::new(1, 4, 6, 2, 2, 2),
        &AttentionOptions::new().window(1, 2).softcap(0.8),
        61,
    );
    check_by_finite_differences(
        &AttentionShape::new(2, 4, 3, 2, 1, 3),
        &AttentionOptions::new()
            .scale(2.0)
            .softcap(1.3)
            .alibi_slopes(vec![0.7, 0.2]),
        62,
    );
    check_by_finite_differences(
        &AttentionShape::new(1, 6, 6, 2, 1, 2),
        &AttentionOptions::new()
            .causal(true)
            .dropout(0.3, 4, 1)
            .softcap(2.0)
            .alibi_slopes(vec![0.3, 0.1])
            .sinks(vec![0.5, -0.5]),
        63,
    );
}

/// `dσ_h` against central differences of the loss in each sink logit, with empty rows (their
/// P_sink is 1 but D is 0) and a window.
#[test]
fn finite_differences_of_the_sink_logits() {
    let s = AttentionShape::new(1, 5, 3, 3, 1, 2);
    let x = inputs(&s, 64);
    let sinks = vec![0.4f32, -1.25, 1.5];
    let options = |sinks: Vec<f32>| {
        AttentionOptions::new()
            .causal(true)
            .window(1, 0)
            .softcap(1.7)
            .sinks(sinks)
    };
    let g = backward(&s, &x.q, &x.k, &x.v, &x.d_o, &options(sinks.clone())).unwrap();
    let d_sinks = g.d_sinks.unwrap();
    // f32 sinks: a step that f32 represents exactly, so the difference quotient sees it.
    let h = 1.0 / 1024.0;
    for head in 0..3 {
        let at = |delta: f32| {
            let mut moved = sinks.clone();
            moved[head] += delta;
            loss(&s, &x, &options(moved))
        };
        let numeric = (at(h) - at(-h)) / (2.0 * h as f64);
        // Central differences err by O(h²) ≈ 1e-6 here.
        assert!(
            (d_sinks[head] - numeric).abs() < 1e-5,
            "head {head}: {} vs {numeric}",
            d_sinks[head]
        );
        assert!(d_sinks[head] != 0.0);
    }
    assert!(
        backward(&s, &x.q, &x.k, &x.v, &x.d_o, &AttentionOptions::new())
            .unwrap()
            .d_sinks
            .is_none()
    );
}

#[test]
fn given_the_forwards_output_the_gradients_are_backwards() {
    let s = AttentionShape::new(2, 5, 7, 4, 2, 8);
    let x = inputs(&s, 11);
    let options = AttentionOptions::new().causal(true).dropout(0.2, 5, 3);
    let o = forward(&s, &x.q, &x.k, &x.v, &options).unwrap().o;
    let want = backward(&s, &x.q, &x.k, &x.v, &x.d_o, &options).unwrap();
    let got = backward_from_output(&s, (&x.q, &x.k, &x.v), &o, &x.d_o, &options).unwrap();
    assert_relative_eq!(got.dq[..], want.dq[..], max_relative = 1e-12);
    assert_relative_eq!(got.dk[..], want.dk[..], max_relative = 1e-12);
    assert_eq!(got.dv, want.dv);
    let short = backward_from_output(&s, (&x.q, &x.k, &x.v), &o[1..], &x.d_o, &options);
    assert!(short.is_err());
}

/// A row that sees one key has `dS = P·(dP − D) = 0` exactly; an `O` off by `ε` in one element
/// gives that row `dS = −dO_c·ε`, so `dQ = scale·dS·K` — the cancellation that a backward fed
/// an `O` rounded to bf16 cannot avoid.
#[test]
fn a_one_key_row_moves_with_the_given_output() {
    let s = AttentionShape::new(1, 1, 1, 1, 1, 4);
    let x = inputs(&s, 3);
    let options = AttentionOptions::new();
    let exact = backward(&s, &x.q, &x.k, &x.v, &x.d_o, &options).unwrap();
    assert!(exact.dq.iter().all(|&g| g.abs() < 1e-15), "{:?}", exact.dq);
    let mut o = x.v.clone();
    let eps = 1e-3;
    o[2] += eps;
    let got = backward_from_output(&s, (&x.q, &x.k, &x.v), &o, &x.d_o, &options).unwrap();
    let scale = 1.0 / 2.0f64;
    for c in 0..4 {
        let want = scale * (-x.d_o[2] * eps) * x.k[c];
        assert_relative_eq!(got.dq[c], want, max_relative = 1e-9);
    }
}

/// The magnitudes bound the signed sums element by element (triangle inequality), equal them
/// where no term is negative (dV's `P·Z·|dO|` against dV of `|dO|`), and stay of the inputs'
/// order where a one-key row makes dQ and dK vanish.
#[test]
fn magnitudes_bound_the_gradients_and_survive_cancellation() {
    let s = AttentionShape::new(2, 5, 7, 4, 2, 8);
    let x = inputs(&s, 13);
    let options = AttentionOptions::new().causal(true).dropout(0.2, 5, 3);
    let o = forward(&s, &x.q, &x.k, &x.v, &options).unwrap().o;
    let signed = backward_from_output(&s, (&x.q, &x.k, &x.v), &o, &x.d_o, &options).unwrap();
    let mags =
        backward_magnitudes_from_output(&s, (&x.q, &x.k, &x.v), &o, &x.d_o, &options).unwrap();
    for (g, m) in [
        (&signed.dq, &mags.dq),
        (&signed.dk, &mags.dk),
        (&signed.dv, &mags.dv),
    ] {
        assert!(g.iter().zip(m).all(|(g, m)| g.abs() <= m + 1e-12));
    }
    let abs_d_o: Vec<f64> = x.d_o.iter().map(|g| g.abs()).collect();
    let dv_of_abs = backward_from_output(&s, (&x.q, &x.k, &x.v), &o, &abs_d_o, &options).unwrap();
    assert_relative_eq!(mags.dv[..], dv_of_abs.dv[..], max_relative = 1e-12);

    let s = AttentionShape::new(1, 1, 1, 1, 1, 4);
    let x = inputs(&s, 3);
    let plain = AttentionOptions::new();
    let o = forward(&s, &x.q, &x.k, &x.v, &plain).unwrap().o;
    let signed = backward_from_output(&s, (&x.q, &x.k, &x.v), &o, &x.d_o, &plain).unwrap();
    let mags = backward_magnitudes_from_output(&s, (&x.q, &x.k, &x.v), &o, &x.d_o, &plain).unwrap();
    assert!(
        signed.dq.iter().all(|&g| g.abs() < 1e-15),
        "{:?}",
        signed.dq
    );
    // dS's magnitude is P·(Σ_c |dO_c·V_c| + |D|), with P = 1 and O = V here.
    let terms: f64 = (0..4).map(|c| (x.d_o[c] * x.v[c]).abs()).sum::<f64>()
        + x.d_o
            .iter()
            .zip(&x.v)
            .map(|(g, v)| g * v)
            .sum::<f64>()
            .abs();
    for c in 0..4 {
        assert_relative_eq!(mags.dq[c], 0.5 * terms * x.k[c].abs(), max_relative = 1e-12);
        assert_relative_eq!(mags.dk[c], 0.5 * terms * x.q[c].abs(), max_relative = 1e-12);
    }
}

/// V and O rows of another head dim than Q and K (narrower, as DeepSeek's 192/128, and wider),
/// with GQA, causal alignment, dropout, score modifiers and sinks.
#[test]
fn finite_differences_with_a_value_head_dim_of_its_own() {
    check_by_finite_differences(
        &AttentionShape::new(1, 4, 5, 2, 1, 3).with_head_dim_v(2),
        &AttentionOptions::new().causal(true),
        70,
    );
    check_by_finite_differences(
        &AttentionShape::new(2, 3, 4, 2, 2, 2).with_head_dim_v(5),
        &AttentionOptions::new()
            .dropout(0.3, 4, 1)
            .key_lengths(vec![4, 2]),
        71,
    );
    check_by_finite_differences(
        &AttentionShape::new(1, 5, 5, 2, 1, 4).with_head_dim_v(1),
        &AttentionOptions::new()
            .window(1, 1)
            .softcap(1.1)
            .alibi_slopes(vec![0.3, 0.6])
            .sinks(vec![0.2, -0.4]),
        72,
    );
    let s = AttentionShape::new(1, 3, 4, 2, 1, 3).with_head_dim_v(2);
    let x = inputs(&s, 73);
    let g = backward(&s, &x.q, &x.k, &x.v, &x.d_o, &AttentionOptions::new()).unwrap();
    assert_eq!(
        (g.dq.len(), g.dk.len(), g.dv.len()),
        (s.q_elems(), s.k_elems(), s.v_elems())
    );
    let wrong_d_o = backward(&s, &x.q, &x.k, &x.v, &x.q, &AttentionOptions::new());
    assert!(wrong_d_o.unwrap_err().to_string().contains("d_o"));
}
