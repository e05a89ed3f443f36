//! Checking a GPU output on sampled rows against the f64 reference of those rows only, for shapes
//! whose full CPU reference would take too long (the running fixture).

use flash_attn::reference::forward_rows_f32;
use flash_attn::{AttentionOptions, AttentionShape, Result};

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
            let at = ((b * shape.n_q + i) * shape.heads_q + h) as usize * d;
            o[at..at + d].iter().map(|&x| x as f64)
        })
        .collect();
    Ok(relative_error(&got, &want))
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
}
