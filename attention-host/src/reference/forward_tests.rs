use attention_kernels::attn::online_state::OnlineState;

use super::*;
use crate::error::AttentionError;
use crate::reference::test_support::inputs;
use approx::assert_relative_eq;

/// Keys `[s_j, 0]` against the query `[1, 0]` with `τ = 1` make the scores exactly `s_j`.
fn scores_as_keys(scores: &[f64]) -> (Vec<f64>, Vec<f64>) {
    (
        vec![1.0, 0.0],
        scores.iter().flat_map(|&s| [s, 0.0]).collect(),
    )
}

#[test]
fn article_three_block_row() {
    let (q, k) = scores_as_keys(&[0.0, -2.0, 3.0, 1.0, -1.0]);
    let v = [1.0, 0.0, 0.0, 2.0, 4.0, 1.0, 2.0, 3.0, -1.0, 2.0];
    let out = forward(
        &AttentionShape::new(1, 1, 5, 1, 1, 2),
        &q,
        &k,
        &v,
        &AttentionOptions::new().scale(1.0),
    )
    .unwrap();
    assert_relative_eq!(
        out.o[..],
        [3.554972349613208, 1.2032242390332164][..],
        epsilon = 1e-12,
        max_relative = 0.0
    );
    assert_relative_eq!(
        out.lse[..],
        [3.19076575192487][..],
        epsilon = 1e-12,
        max_relative = 0.0
    );
}

#[test]
fn article_masked_row_six_lse() {
    // 0x0AD: keys 7.. of row 6 are masked, here by a key length of 7.
    let (q, k) = scores_as_keys(&[0.0, -2.0, 3.0, 1.0, -1.0, 4.0, 2.0, 7.0, 5.0, 6.0]);
    let v = vec![0.5; 20];
    let options = AttentionOptions::new().scale(1.0).key_lengths(vec![7]);
    let out = forward(
        &AttentionShape::new(1, 1, 10, 1, 1, 2),
        &q,
        &k,
        &v,
        &options,
    )
    .unwrap();
    assert_relative_eq!(
        out.lse[..],
        [4.0 + 1.580534130840f64.ln()][..],
        epsilon = 1e-12,
        max_relative = 0.0
    );
    assert_relative_eq!(
        out.o[..],
        [0.5, 0.5][..],
        epsilon = 1e-15,
        max_relative = 0.0
    );
}

#[test]
fn article_naive_block_counterexample() {
    let out = forward(
        &AttentionShape::new(1, 1, 3, 1, 1, 1),
        &[1.0],
        &[0.0, 0.0, 10.0],
        &[1.0, 1.0, 100.0],
        &AttentionOptions::new().scale(1.0),
    )
    .unwrap();
    assert!((out.o[0] - 99.9910116300).abs() < 1e-9, "{}", out.o[0]);
}

/// Folds each row's keys through `OnlineState` in tiles of 3, an implementation independent of the
/// dense reference.
#[test]
fn matches_the_online_state_fold_under_masks_and_gqa() {
    const D: usize = 4;
    let s = AttentionShape::new(2, 5, 7, 4, 2, D as u32);
    let x = inputs(&s, 1);
    for options in [
        AttentionOptions::new(),
        AttentionOptions::new().causal(true),
        AttentionOptions::new()
            .scale(0.7)
            .causal(true)
            .key_lengths(vec![3, 7]),
    ] {
        let out = forward(&s, &x.q, &x.k, &x.v, &options).unwrap();
        let problem = super::super::row::Problem::new(&s, &x.q, &x.k, &options);
        for row in problem.rows() {
            let q_off = problem.row_offset(&row, D as u32);
            let scores = &row.softmax.scores;
            let values: Vec<[f64; D]> = (0..scores.len())
                .map(|j| core::array::from_fn(|c| x.v[problem.key_offset(&row, j, D as u32) + c]))
                .collect();
            let state = (0..scores.len())
                .step_by(3)
                .map(|t| {
                    let end = (t + 3).min(scores.len());
                    OnlineState::from_tile(&scores[t..end], &values[t..end])
                })
                .fold(OnlineState::identity(), |acc, t| acc.merge(&t));
            assert_relative_eq!(
                out.o[q_off..q_off + D][..],
                state.output()[..],
                epsilon = 1e-14,
                max_relative = 0.0
            );
            let lse =
                out.lse[problem.lse_index(row.seq.item, row.head, row.seq.q_start + row.local)];
            assert_relative_eq!(
                [lse][..],
                [state.lse()][..],
                epsilon = 1e-14,
                max_relative = 0.0
            );
        }
    }
}

#[test]
fn scores_use_tau_times_the_dot_product() {
    let s = AttentionShape::new(1, 1, 2, 1, 1, 2);
    let (q, k, v) = ([1.0, 2.0], [1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0]);
    let out = forward(&s, &q, &k, &v, &AttentionOptions::new()).unwrap();
    // Default τ = 1/√2, rounded to f32 as the kernels hold it: scores [3τ, 0].
    let tau = (1.0 / 2.0f32.sqrt()) as f64;
    let p0 = 1.0 / (1.0 + (-3.0 * tau).exp());
    assert_relative_eq!(
        out.o[..],
        [p0, 1.0 - p0][..],
        epsilon = 1e-15,
        max_relative = 0.0
    );
    assert_relative_eq!(
        out.lse[..],
        [3.0 * tau + (1.0 + (-3.0 * tau).exp()).ln()][..],
        epsilon = 1e-15,
        max_relative = 0.0
    );
}

#[test]
fn gqa_equals_mha_with_repeated_kv_heads() {
    let gqa = AttentionShape::new(2, 3, 5, 6, 2, 3);
    let x = inputs(&gqa, 2);
    let mha = AttentionShape { heads_kv: 6, ..gqa };
    let repeat =
        |t: &[f64]| -> Vec<f64> { t.chunks(3).flat_map(|head| [head; 3].concat()).collect() };
    let options = AttentionOptions::new().causal(true);
    let a = forward(&gqa, &x.q, &x.k, &x.v, &options).unwrap();
    let b = forward(&mha, &x.q, &repeat(&x.k), &repeat(&x.v), &options).unwrap();
    assert_eq!(a, b);
}

#[test]
fn packed_sequences_equal_separate_calls() {
    let (cu_q, cu_k) = (vec![0u32, 2, 2, 6], vec![0u32, 3, 5, 9]);
    let s = AttentionShape::new(1, 6, 9, 2, 1, 3);
    let x = inputs(&s, 3);
    let options = AttentionOptions::new()
        .causal(true)
        .packed(cu_q.clone(), cu_k.clone());
    let packed = forward(&s, &x.q, &x.k, &x.v, &options).unwrap();
    for seq in 0..3 {
        let (q0, q1, k0, k1) = (
            cu_q[seq] as usize,
            cu_q[seq + 1] as usize,
            cu_k[seq] as usize,
            cu_k[seq + 1] as usize,
        );
        if q0 == q1 {
            continue;
        }
        let one = AttentionShape::new(1, (q1 - q0) as u32, (k1 - k0) as u32, 2, 1, 3);
        let alone = forward(
            &one,
            &x.q[q0 * 6..q1 * 6],
            &x.k[k0 * 3..k1 * 3],
            &x.v[k0 * 3..k1 * 3],
            &AttentionOptions::new().causal(true),
        )
        .unwrap();
        assert_eq!(&packed.o[q0 * 6..q1 * 6], &alone.o[..]);
        for h in 0..2 {
            assert_eq!(
                &packed.lse[h * 6 + q0..h * 6 + q1],
                &alone.lse[h * (q1 - q0)..(h + 1) * (q1 - q0)]
            );
        }
    }
}

#[test]
fn key_lengths_equal_truncated_keys_with_causal_aligned_to_the_length() {
    let s = AttentionShape::new(1, 4, 6, 1, 1, 2);
    let x = inputs(&s, 4);
    for causal in [false, true] {
        let padded = forward(
            &s,
            &x.q,
            &x.k,
            &x.v,
            &AttentionOptions::new().causal(causal).key_lengths(vec![5]),
        )
        .unwrap();
        let short = forward(
            &AttentionShape::new(1, 4, 5, 1, 1, 2),
            &x.q,
            &x.k[..10],
            &x.v[..10],
            &AttentionOptions::new().causal(causal),
        )
        .unwrap();
        assert_eq!(padded, short);
    }
}

#[test]
fn causal_is_bottom_right_aligned_and_empty_rows_are_zero() {
    // n_q = 5 > n_k = 3: rows 0 and 1 see no key, row 4 sees all three.
    let s = AttentionShape::new(1, 5, 3, 1, 1, 2);
    let x = inputs(&s, 5);
    let out = forward(&s, &x.q, &x.k, &x.v, &AttentionOptions::new().causal(true)).unwrap();
    assert_eq!(&out.o[..4], &[0.0; 4]);
    assert_eq!(&out.lse[..2], &[f64::NEG_INFINITY; 2]);
    assert!(out.o.iter().chain(&out.lse).all(|x| !x.is_nan()));
    let last = forward(
        &AttentionShape::new(1, 1, 3, 1, 1, 2),
        &x.q[8..],
        &x.k,
        &x.v,
        &AttentionOptions::new(),
    )
    .unwrap();
    assert_eq!(&out.o[8..], &last.o[..]);
    // Row 2 sees key 0 only: its output is v_0 and its LSE that one score.
    assert_eq!(&out.o[4..6], &x.v[..2]);
    let tau = (1.0 / 2.0f32.sqrt()) as f64;
    assert_relative_eq!(
        out.lse[2..3][..],
        [tau * (x.q[4] * x.k[0] + x.q[5] * x.k[1])][..],
        epsilon = 1e-15,
        max_relative = 0.0
    );
}

/// With one-hot values `v_j = e_j`, `O_ij = P_ij Z_ij`: the mask read back from `O` must be
/// `DropoutRng::keep` at every (sequence, head, local row, local column).
#[test]
fn dropout_mask_is_the_philox_keep_bit_at_every_coordinate() {
    let (cu_q, cu_k) = (vec![0u32, 3, 7], vec![0u32, 5, 8]);
    let s = AttentionShape::new(1, 7, 8, 4, 2, 8);
    let x = inputs(&s, 6);
    let mut v = vec![0.0; s.v_elems()];
    for key in 0..8 {
        for g in 0..2 {
            let local = if key < 5 { key } else { key - 5 };
            v[(key * 2 + g) * 8 + local] = 1.0;
        }
    }
    let plain = AttentionOptions::new().packed(cu_q.clone(), cu_k.clone());
    let dropped = plain.clone().dropout(0.4, 77, 3);
    let rng = dropped.dropout_rng();
    let a = forward(&s, &x.q, &x.k, &v, &plain).unwrap();
    let b = forward(&s, &x.q, &x.k, &v, &dropped).unwrap();
    assert_eq!(a.lse, b.lse, "LSE is the undropped normaliser");
    let mut kept = 0;
    for seq in 0..2usize {
        for h in 0..4u32 {
            for row in 0..cu_q[seq + 1] - cu_q[seq] {
                for col in 0..cu_k[seq + 1] - cu_k[seq] {
                    let off = ((cu_q[seq] + row) as usize * 4 + h as usize) * 8 + col as usize;
                    let keep = rng.keep(seq as u32, h, row, col);
                    kept += keep as u32;
                    let z = if keep {
                        1.0 / (1.0 - 0.4f32 as f64)
                    } else {
                        0.0
                    };
                    assert_eq!(
                        b.o[off],
                        a.o[off] * z,
                        "seq {seq} head {h} row {row} col {col}"
                    );
                }
            }
        }
    }
    assert!(
        kept > 0 && kept < 4 * (3 * 5 + 4 * 3),
        "both outcomes occur"
    );
}

#[test]
fn non_finite_policy() {
    let s = AttentionShape::new(1, 3, 3, 1, 1, 1);
    let k = [1.0, 2.0, 3.0];
    let v = [1.0, 10.0, 100.0];
    let run = |q: &[f64], k: &[f64], v: &[f64], options: AttentionOptions| {
        forward(&s, q, k, v, &options).unwrap()
    };

    // A NaN query or a +∞ score poisons its own row only.
    let out = run(
        &[1.0, f64::NAN, f64::INFINITY],
        &k,
        &v,
        AttentionOptions::new(),
    );
    assert!(out.o[0].is_finite() && out.lse[0].is_finite());
    assert!(out.o[1].is_nan() && out.lse[1].is_nan());
    assert!(out.o[2].is_nan() && out.lse[2].is_nan());

    // A −∞ score is masked: same as dropping that key, and its V is never read.
    let out = run(
        &[1.0, 1.0, 1.0],
        &[1.0, f64::NEG_INFINITY, 3.0],
        &[1.0, f64::NAN, 100.0],
        AttentionOptions::new(),
    );
    let without = forward(
        &AttentionShape::new(1, 3, 2, 1, 1, 1),
        &[1.0; 3],
        &[1.0, 3.0],
        &[1.0, 100.0],
        &AttentionOptions::new(),
    )
    .unwrap();
    assert_eq!(out, without);

    // All scores −∞ is a row with no allowed key.
    let out = run(
        &[-1.0, 1.0, 1.0],
        &[f64::INFINITY; 3],
        &v,
        AttentionOptions::new(),
    );
    assert_eq!((out.o[0], out.lse[0]), (0.0, f64::NEG_INFINITY));

    // A NaN value behind the causal mask never reaches O; at an allowed key it does.
    let out = run(
        &[1.0, 1.0, 1.0],
        &k,
        &[1.0, 10.0, f64::NAN],
        AttentionOptions::new().causal(true),
    );
    assert!(out.o[0].is_finite() && out.o[1].is_finite() && out.o[2].is_nan());
}

#[test]
fn invalid_inputs_are_refused() {
    let s = AttentionShape::new(2, 3, 4, 2, 1, 2);
    let x = inputs(&s, 7);
    let refused = |r: Result<Forward>| matches!(r, Err(AttentionError::InvalidInput(_)));
    assert!(refused(forward(
        &s,
        &x.q[1..],
        &x.k,
        &x.v,
        &AttentionOptions::new()
    )));
    assert!(refused(forward(
        &s,
        &x.q,
        &x.k,
        &x.v[1..],
        &AttentionOptions::new()
    )));
    assert!(refused(forward(
        &s,
        &x.q,
        &x.k,
        &x.v,
        &AttentionOptions::new().key_lengths(vec![5, 1])
    )));
    assert!(refused(forward(
        &s,
        &x.q,
        &x.k,
        &x.v,
        &AttentionOptions::new().dropout(1.0, 0, 0)
    )));
    assert!(refused(forward(
        &AttentionShape { heads_kv: 3, ..s },
        &x.q,
        &x.k,
        &x.v,
        &AttentionOptions::new()
    )));
}

#[test]
fn f32_entry_point_widens_exactly() {
    let s = AttentionShape::new(1, 3, 4, 2, 2, 3);
    let x = inputs(&s, 8);
    let narrow = |t: &[f64]| t.iter().map(|&v| v as f32).collect::<Vec<f32>>();
    let wide = |t: &[f64]| t.iter().map(|&v| v as f32 as f64).collect::<Vec<f64>>();
    let options = AttentionOptions::new().causal(true);
    let a =
        crate::reference::forward_f32(&s, &narrow(&x.q), &narrow(&x.k), &narrow(&x.v), &options)
            .unwrap();
    let b = forward(&s, &wide(&x.q), &wide(&x.k), &wide(&x.v), &options).unwrap();
    assert_eq!(a, b);
}

#[test]
fn forward_rows_equal_the_same_rows_of_forward() {
    let s = AttentionShape::new(2, 7, 9, 4, 2, 5);
    let x = inputs(&s, 11);
    let options = AttentionOptions::new()
        .causal(true)
        .key_lengths(vec![9, 4])
        .dropout(0.25, 7, 1);
    let full = forward(&s, &x.q, &x.k, &x.v, &options).unwrap();
    let rows = [(0, 0, 0), (1, 3, 6), (1, 2, 0), (0, 1, 4)];
    let picked = forward_rows(&s, &x.q, &x.k, &x.v, &options, &rows).unwrap();
    for (n, &(b, h, i)) in rows.iter().enumerate() {
        let at = (((b * 7 + i) * 4 + h) * 5) as usize;
        assert_eq!(
            &picked[n * 5..(n + 1) * 5],
            &full.o[at..at + 5],
            "row {:?}",
            (b, h, i)
        );
    }
    // Packed: a row past the last sequence does not exist.
    let p = AttentionShape::new(1, 6, 9, 2, 1, 3);
    let y = inputs(&p, 4);
    let packed = AttentionOptions::new().packed(vec![0, 2, 5], vec![0, 3, 9]);
    let err = forward_rows(&p, &y.q, &y.k, &y.v, &packed, &[(0, 0, 5)]).unwrap_err();
    assert!(matches!(err, AttentionError::InvalidInput(_)), "{err}");
    let err = forward_rows(&s, &x.q, &x.k, &x.v, &options, &[(0, 4, 0)]).unwrap_err();
    assert!(matches!(err, AttentionError::InvalidInput(_)), "{err}");
}

/// O of a value head dim other than the query/key one equals O of V padded with zero columns to
/// the query/key head dim (or of Q and K padded to a wider V), cut to its own columns; the
/// scale defaults to `1/√head_dim` of Q and K; the LSE does not depend on V.
#[test]
fn a_value_head_dim_of_its_own_is_zero_padding_cut_off() {
    let pad = |x: &[f64], rows: usize, from: usize, to: usize| -> Vec<f64> {
        (0..rows)
            .flat_map(|r| (0..to).map(move |c| if c < from { x[r * from + c] } else { 0.0 }))
            .collect()
    };
    for (d, d_v) in [(6u32, 4u32), (3, 5)] {
        let s = AttentionShape::new(2, 5, 7, 4, 2, d).with_head_dim_v(d_v);
        let x = inputs(&s, 8);
        let options = AttentionOptions::new().causal(true).key_lengths(vec![7, 3]);
        let got = forward(&s, &x.q, &x.k, &x.v, &options).unwrap();
        let wide = d.max(d_v);
        let padded = AttentionShape::new(2, 5, 7, 4, 2, wide);
        let (q_rows, k_rows) = ((2 * 5 * 4) as usize, (2 * 7 * 2) as usize);
        let (q, k, v) = (
            pad(&x.q, q_rows, d as usize, wide as usize),
            pad(&x.k, k_rows, d as usize, wide as usize),
            pad(&x.v, k_rows, d_v as usize, wide as usize),
        );
        let scaled = options.clone().scale(1.0 / (d as f32).sqrt());
        let want = forward(&padded, &q, &k, &v, &scaled).unwrap();
        let cut: Vec<f64> = want
            .o
            .chunks(wide as usize)
            .flat_map(|row| row[..d_v as usize].to_vec())
            .collect();
        assert_eq!(got.o.len(), s.o_elems());
        assert_relative_eq!(got.o[..], cut[..], max_relative = 1e-13);
        assert_relative_eq!(got.lse[..], want.lse[..], max_relative = 1e-13);
    }
}
