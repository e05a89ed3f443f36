//! Checking a GPU output on sampled rows against a straightforward f64 computation of those rows,
//! for shapes whose full CPU reference would take too long (the running fixture).

use attention_host::{AttentionOptions, AttentionShape};
use attention_kernels::params::causal_key_end;

/// One output row `O[b, i, h, :]` in f64: scores, causal mask, softmax, `PV`. Inputs are the
/// values the GPU read (already rounded to the storage dtype). A row with no allowed key is 0.
pub fn dense_row(
    shape: &AttentionShape,
    options: &AttentionOptions,
    (q, k, v): (&[f32], &[f32], &[f32]),
    (b, h, i): (u32, u32, u32),
) -> Vec<f64> {
    let d = shape.head_dim as usize;
    let hk = shape.kv_head(h);
    let q_at = ((b * shape.n_q + i) * shape.heads_q + h) as usize * d;
    let k_at = |j: u32| ((b * shape.n_k + j) * shape.heads_kv + hk) as usize * d;
    let scale = options.scale_for(shape.head_dim) as f64;
    let end = if options.causal {
        causal_key_end(i, shape.n_q, shape.n_k)
    } else {
        shape.n_k
    };
    let scores: Vec<f64> = (0..end)
        .map(|j| {
            let dot: f64 = (0..d)
                .map(|c| q[q_at + c] as f64 * k[k_at(j) + c] as f64)
                .sum();
            scale * dot
        })
        .collect();
    let mut out = vec![0.0; d];
    let Some(row_max) = scores.iter().copied().reduce(f64::max) else {
        return out;
    };
    let weights: Vec<f64> = scores.iter().map(|s| (s - row_max).exp()).collect();
    let row_sum: f64 = weights.iter().sum();
    for (j, w) in weights.iter().enumerate() {
        let at = k_at(j as u32);
        for c in 0..d {
            out[c] += w / row_sum * v[at + c] as f64;
        }
    }
    out
}

/// Relative error `‖got − want‖ / ‖want‖` over all sampled rows (absolute when `want` is 0).
pub fn relative_error(got: &[f64], want: &[f64]) -> f64 {
    let diff: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w) * (g - w))
        .sum::<f64>()
        .sqrt();
    let norm: f64 = want.iter().map(|w| w * w).sum::<f64>().sqrt();
    if norm == 0.0 { diff } else { diff / norm }
}

/// Compares rows of `o` (`[batch, n_q, heads_q, head_dim]`) at `rows` with `dense_row`; returns the
/// relative error over all of them, or NaN if any sampled element is not finite.
pub fn check_rows(
    shape: &AttentionShape,
    options: &AttentionOptions,
    qkv: (&[f32], &[f32], &[f32]),
    o: &[f32],
    rows: &[(u32, u32, u32)],
) -> f64 {
    let d = shape.head_dim as usize;
    let mut got = Vec::with_capacity(rows.len() * d);
    let mut want = Vec::with_capacity(rows.len() * d);
    for &(b, h, i) in rows {
        let at = ((b * shape.n_q + i) * shape.heads_q + h) as usize * d;
        got.extend(o[at..at + d].iter().map(|&x| x as f64));
        want.extend(dense_row(shape, options, qkv, (b, h, i)));
    }
    if got.iter().any(|x| !x.is_finite()) {
        return f64::NAN;
    }
    relative_error(&got, &want)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_row_matches_a_hand_computed_row() {
        // One head, d = 1, two keys; scores τ·q·k = [0, ln 3] with τ = 1 give weights [1/4, 3/4].
        let shape = AttentionShape {
            batch: 1,
            n_q: 1,
            n_k: 2,
            heads_q: 1,
            heads_kv: 1,
            head_dim: 1,
        };
        let options = AttentionOptions::new().scale(1.0);
        let (q, k, v) = ([3f32.ln()], [0.0f32, 1.0], [4.0f32, 8.0]);
        let row = dense_row(&shape, &options, (&q, &k, &v), (0, 0, 0));
        assert!((row[0] - 7.0).abs() < 1e-6, "{row:?}");
        // Causal with n_q = n_k = 2: row 0 sees key 0 only.
        let shape2 = AttentionShape { n_q: 2, ..shape };
        let q2 = [3f32.ln(), 3f32.ln()];
        let causal = options.clone().causal(true);
        assert_eq!(dense_row(&shape2, &causal, (&q2, &k, &v), (0, 0, 0)), [4.0]);
        assert_eq!(relative_error(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
    }
}
