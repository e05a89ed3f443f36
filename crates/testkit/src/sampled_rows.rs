//! Checking a GPU output on sampled rows against the f64 reference of those rows only, for shapes
//! whose full CPU reference would take too long (the running fixture).

use attention_kernels::abi::shape::allowed_key_end;
use flash_attn::reference::forward_rows_f32;
use flash_attn::{AttentionError, AttentionOptions, AttentionShape, Lengths, Result};

/// Relative error `‖got − want‖ / ‖want‖` (absolute when `want` is 0); NaN if `got` is not finite.
pub fn relative_error(got: &[f64], want: &[f64]) -> f64 {
    if got.iter().any(|x| !x.is_finite()) {
        return f64::NAN;
    }
    let diff: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w) * (g - w))
        .sum::<f64>()
        .sqrt();
    let norm: f64 = want.iter().map(|w| w * w).sum::<f64>().sqrt();
    if norm == 0.0 { diff } else { diff / norm }
}

/// Compares rows of `o` (`[batch, n_q, heads_q, head_dim]`) at `rows` (`(batch, head, row)`) with
/// the reference; returns the relative error over all of them (NaN if any is not finite).
pub fn check_rows(
    shape: &AttentionShape,
    options: &AttentionOptions,
    (q, k, v): (&[f32], &[f32], &[f32]),
    o: &[f32],
    rows: &[(u32, u32, u32)],
) -> Result<f64> {
    let d = shape.head_dim as usize;
    let want = forward_rows_f32(shape, q, k, v, options, rows)?;
    let got: Vec<f64> = rows
        .iter()
        .flat_map(|&(b, h, i)| {
            let at = ((b as usize * shape.n_q as usize + i as usize) * shape.heads_q as usize
                + h as usize)
                * d;
            o[at..at + d].iter().map(|&x| x as f64)
        })
        .collect();
    Ok(relative_error(&got, &want))
}

/// The f64 reference of one query row, forward and backward: its O, LSE, and dQ.
pub struct RowReference {
    pub o: Vec<f64>,
    pub lse: f64,
    pub dq: Vec<f64>,
}

/// Element readers of the four inputs by flat index (Q and dO `[batch, n_q, heads_q, d]`, K and
/// V `[batch, n_k, heads_kv, d]`), so a caller holding them in any storage (bf16 bits of tensors
/// too large to widen) checks rows without a copy.
pub struct RowInputs<Q, K, V, G> {
    pub q: Q,
    pub k: K,
    pub v: V,
    pub d_o: G,
}

/// Row `(b, h, i)` in f64 for a call with a scale and the causal mask only (no lengths, no
/// dropout): `s_j = τ q·k_j` over the row's allowed keys, `p = softmax(s)`, `o = Σ p_j v_j`,
/// `LSE = m + ln ℓ`, and with `D = dO·o`, `dq = τ Σ_j p_j (dO·v_j − D) k_j`. A row with no
/// allowed key has `o = dq = 0` and `LSE = −∞`. Cost: two passes over the row's keys.
pub fn row_reference<Q, K, V, G>(
    shape: &AttentionShape,
    options: &AttentionOptions,
    (b, h, i): (u32, u32, u32),
    x: &RowInputs<Q, K, V, G>,
) -> Result<RowReference>
where
    Q: Fn(usize) -> f64,
    K: Fn(usize) -> f64,
    V: Fn(usize) -> f64,
    G: Fn(usize) -> f64,
{
    if options.dropout.is_some() || options.lengths != Lengths::Full {
        return Err(AttentionError::InvalidInput(
            "row_reference takes scale and causal only".into(),
        ));
    }
    let s = shape;
    let d = s.head_dim as usize;
    let tau = options.scale_for(s.head_dim) as f64;
    let q_at = ((b as usize * s.n_q as usize + i as usize) * s.heads_q as usize + h as usize) * d;
    let hk = s.kv_head(h) as usize;
    let k_at = |j: usize| ((b as usize * s.n_k as usize + j) * s.heads_kv as usize + hk) * d;
    let end = allowed_key_end(i, s.n_q, s.n_k, options.causal) as usize;
    let q: Vec<f64> = (0..d).map(|c| (x.q)(q_at + c)).collect();
    let d_o: Vec<f64> = (0..d).map(|c| (x.d_o)(q_at + c)).collect();
    let scores: Vec<f64> = (0..end)
        .map(|j| tau * (0..d).map(|c| q[c] * (x.k)(k_at(j) + c)).sum::<f64>())
        .collect();
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if end == 0 {
        return Ok(RowReference {
            o: vec![0.0; d],
            lse: f64::NEG_INFINITY,
            dq: vec![0.0; d],
        });
    }
    let l: f64 = scores.iter().map(|&x| (x - m).exp()).sum();
    let p: Vec<f64> = scores.iter().map(|&x| (x - m).exp() / l).collect();
    let mut o = vec![0.0; d];
    for (j, &pj) in p.iter().enumerate() {
        for (c, oc) in o.iter_mut().enumerate() {
            *oc += pj * (x.v)(k_at(j) + c);
        }
    }
    let big_d: f64 = d_o.iter().zip(&o).map(|(a, b)| a * b).sum();
    let mut dq = vec![0.0; d];
    for (j, &pj) in p.iter().enumerate() {
        let dp: f64 = (0..d).map(|c| d_o[c] * (x.v)(k_at(j) + c)).sum();
        let ds = pj * (dp - big_d);
        for (c, g) in dq.iter_mut().enumerate() {
            *g += tau * ds * (x.k)(k_at(j) + c);
        }
    }
    Ok(RowReference {
        o,
        lse: m + l.ln(),
        dq,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_error_is_zero_for_equal_and_nan_for_unwritten() {
        assert_eq!(relative_error(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!((relative_error(&[3.0, 4.0], &[0.0, 0.0]) - 5.0).abs() < 1e-15);
        assert!((relative_error(&[1.0, 0.0], &[2.0, 0.0]) - 0.5).abs() < 1e-15);
        assert!(relative_error(&[f64::NAN], &[1.0]).is_nan());
    }

    #[test]
    fn check_rows_finds_a_wrong_row() {
        // One head, d = 1, two keys; scores τ·q·k = [0, ln 3] with τ = 1 give weights [1/4, 3/4].
        let shape = AttentionShape {
            batch: 1,
            n_q: 2,
            n_k: 2,
            heads_q: 1,
            heads_kv: 1,
            head_dim: 1,
            head_dim_v: 1,
        };
        let options = AttentionOptions::new().scale(1.0);
        let (q, k, v) = ([3f32.ln(), 0.0], [0.0f32, 1.0], [4.0f32, 8.0]);
        // Row 0: 4/4 + 8·3/4 = 7; row 1 (q = 0): equal weights, 6.
        let good = check_rows(
            &shape,
            &options,
            (&q, &k, &v),
            &[7.0, 6.0],
            &[(0, 0, 0), (0, 0, 1)],
        )
        .unwrap();
        assert!(good < 1e-6, "{good}");
        let bad = check_rows(&shape, &options, (&q, &k, &v), &[7.0, 6.5], &[(0, 0, 1)]).unwrap();
        assert!((bad - 0.5 / 6.0).abs() < 1e-6, "{bad}");
    }

    #[test]
    fn row_reference_matches_the_full_reference() {
        use flash_attn::reference::{backward_f32, forward_f32};
        let shape = AttentionShape {
            batch: 2,
            n_q: 5,
            n_k: 7,
            heads_q: 4,
            heads_kv: 2,
            head_dim: 8,
            head_dim_v: 8,
        };
        let wave =
            |n: usize, k: f32| -> Vec<f32> { (0..n).map(|x| (x as f32 * k).sin() * 1.5).collect() };
        let (q, k, v, d_o) = (
            wave(shape.q_elems(), 0.7),
            wave(shape.k_elems(), 1.3),
            wave(shape.v_elems(), 2.1),
            wave(shape.q_elems(), 0.37),
        );
        let at = |t: &[f32]| t.to_vec();
        let (qv, kv, vv, gv) = (at(&q), at(&k), at(&v), at(&d_o));
        let inputs = RowInputs {
            q: |e: usize| qv[e] as f64,
            k: |e: usize| kv[e] as f64,
            v: |e: usize| vv[e] as f64,
            d_o: |e: usize| gv[e] as f64,
        };
        for causal in [false, true] {
            let options = AttentionOptions::new().causal(causal);
            let f = forward_f32(&shape, &q, &k, &v, &options).unwrap();
            let g = backward_f32(&shape, &q, &k, &v, &d_o, &options).unwrap();
            for (b, h, i) in [(0, 0, 0), (1, 3, 4), (1, 2, 1), (0, 1, 3)] {
                let r = row_reference(&shape, &options, (b, h, i), &inputs).unwrap();
                let row = ((b * shape.n_q + i) * shape.heads_q + h) as usize * 8;
                let lse = ((b * shape.heads_q + h) * shape.n_q + i) as usize;
                assert!((r.lse - f.lse[lse]).abs() < 1e-12, "{causal} {b} {h} {i}");
                for c in 0..8 {
                    assert!((r.o[c] - f.o[row + c]).abs() < 1e-12);
                    assert!((r.dq[c] - g.dq[row + c]).abs() < 1e-12, "dq {c}");
                }
            }
        }
    }
}
