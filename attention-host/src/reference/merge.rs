//! Reference merge of saved `(O, LSE)` parts over disjoint key sets, in f64, with the policy of
//! `attention_kernels::attn::merge` (the same functions the merge kernel runs).

use attention_kernels::attn::merge::{merged_lse, part_weight};

use super::forward::Forward;
use crate::error::{Result, invalid};
use crate::merge::PartShape;

/// One saved part: `o` `[batch, n_q, heads, head_dim]`, `lse` `[batch, heads, n_q]`.
#[derive(Clone, Copy, Debug)]
pub struct Part<'a> {
    pub o: &'a [f64],
    pub lse: &'a [f64],
}

/// The `(O, LSE)` of the union of the parts' key sets. Empty parts (`LSE = −∞`) are skipped;
/// rows empty in every part are `O = 0`, `LSE = −∞`; a NaN LSE makes its row NaN.
pub fn merge(shape: &PartShape, parts: &[Part]) -> Result<Forward> {
    let (o_elems, lse_elems) = (shape.o_elems()?, shape.lse_elems()?);
    for (p, part) in parts.iter().enumerate() {
        if part.o.len() != o_elems || part.lse.len() != lse_elems {
            return Err(invalid!(
                "part {p} holds {} O and {} LSE elements, the shape {shape:?} needs {o_elems} and {lse_elems}",
                part.o.len(),
                part.lse.len()
            ));
        }
    }
    let (n_q, heads, d) = (
        shape.n_q as usize,
        shape.heads as usize,
        shape.head_dim as usize,
    );
    let mut o = vec![0.0; o_elems];
    let mut lse = vec![f64::NEG_INFINITY; lse_elems];
    for (row, out) in o.chunks_mut(d.max(1)).enumerate() {
        let (bi, h) = (row / heads, row % heads);
        let (b, i) = (bi / n_q, bi % n_q);
        let l = (b * heads + h) * n_q + i;
        let merged = merged_lse(parts.iter().map(|p| p.lse[l]));
        lse[l] = merged;
        for part in parts {
            if let Some(w) = part_weight(part.lse[l], merged) {
                for (x, &y) in out.iter_mut().zip(&part.o[row * d..]) {
                    *x += w * y;
                }
            }
        }
    }
    Ok(Forward { o, lse })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::AttentionOptions;
    use crate::reference::forward;
    use crate::reference::test_support::inputs;
    use attention_kernels::abi::shape::AttentionShape;

    fn part_shape(s: &AttentionShape) -> PartShape {
        PartShape {
            batch: s.batch,
            n_q: s.n_q,
            heads: s.heads_q,
            head_dim: s.head_dim,
        }
    }

    /// K and V of keys `keys` of every batch item, as a shape with that many keys.
    fn key_slice(s: &AttentionShape, x: &[f64], keys: std::ops::Range<u32>) -> Vec<f64> {
        let row = (s.heads_kv * s.head_dim) as usize;
        (0..s.batch as usize)
            .flat_map(|b| {
                let first = (b * s.n_k as usize + keys.start as usize) * row;
                x[first..first + keys.len() * row].to_vec()
            })
            .collect()
    }

    /// The forward over keys `0..split` and `split..n_k` merged equals the forward over all keys
    /// (no causal mask: the split is over keys every row may see).
    fn split_and_merge(s: AttentionShape, splits: &[u32], seed: u64) -> (Forward, Forward) {
        let x = inputs(&s, seed);
        let whole = forward(&s, &x.q, &x.k, &x.v, &AttentionOptions::new()).unwrap();
        let mut bounds = vec![0];
        bounds.extend_from_slice(splits);
        bounds.push(s.n_k);
        let pieces: Vec<Forward> = bounds
            .windows(2)
            .map(|w| {
                let sub = AttentionShape {
                    n_k: w[1] - w[0],
                    ..s
                };
                let (k, v) = (
                    key_slice(&s, &x.k, w[0]..w[1]),
                    key_slice(&s, &x.v, w[0]..w[1]),
                );
                forward(&sub, &x.q, &k, &v, &AttentionOptions::new()).unwrap()
            })
            .collect();
        let parts: Vec<Part> = pieces
            .iter()
            .map(|f| Part {
                o: &f.o,
                lse: &f.lse,
            })
            .collect();
        (merge(&part_shape(&s), &parts).unwrap(), whole)
    }

    fn assert_close(a: &[f64], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= tol, "{x} vs {y}");
        }
    }

    #[test]
    fn merging_two_key_halves_is_the_forward_over_all_keys() {
        for (s, splits) in [
            (AttentionShape::new(2, 3, 40, 4, 2, 16), vec![20]),
            (AttentionShape::new(1, 5, 33, 2, 1, 8), vec![1, 17, 32]),
            (AttentionShape::new(3, 1, 64, 8, 2, 32), vec![7]),
        ] {
            let (merged, whole) = split_and_merge(s, &splits, 11);
            assert_close(&merged.o, &whole.o, 1e-12);
            assert_close(&merged.lse, &whole.lse, 1e-12);
        }
    }

    #[test]
    fn empty_parts_contribute_nothing_and_all_empty_rows_are_zero() {
        let s = AttentionShape::new(2, 2, 12, 2, 2, 4);
        let x = inputs(&s, 5);
        // Item 0 sees 5 keys, item 1 none: its rows are empty in both parts.
        let options = AttentionOptions::new().key_lengths(vec![5, 0]);
        let f = forward(&s, &x.q, &x.k, &x.v, &options).unwrap();
        let ps = part_shape(&s);
        let empty_lse = vec![f64::NEG_INFINITY; f.lse.len()];
        // The empty part's O is garbage: it must not be read.
        let garbage = vec![f64::NAN; f.o.len()];
        let parts = [
            Part {
                o: &garbage,
                lse: &empty_lse,
            },
            Part {
                o: &f.o,
                lse: &f.lse,
            },
        ];
        let merged = merge(&ps, &parts).unwrap();
        assert_eq!(merged, f);
        let half = f.o.len() / 2;
        assert!(merged.o[half..].iter().all(|&x| x == 0.0));
        assert!(
            merged.lse[f.lse.len() / 2..]
                .iter()
                .all(|&l| l == f64::NEG_INFINITY)
        );
        let none = merge(&ps, &[]).unwrap();
        assert!(none.o.iter().all(|&x| x == 0.0));
        assert!(none.lse.iter().all(|&l| l == f64::NEG_INFINITY));
    }

    #[test]
    fn a_nan_part_makes_its_row_nan_in_any_order() {
        let s = AttentionShape::new(1, 2, 8, 1, 1, 4);
        let (a, _) = split_and_merge(s, &[4], 3);
        let mut bad = a.clone();
        bad.lse[1] = f64::NAN;
        bad.o[4..8].fill(f64::NAN);
        let ps = part_shape(&s);
        for parts in [[&a, &bad], [&bad, &a]] {
            let parts = parts.map(|f| Part {
                o: &f.o,
                lse: &f.lse,
            });
            let m = merge(&ps, &parts).unwrap();
            assert!(m.lse[1].is_nan() && m.o[4..8].iter().all(|x| x.is_nan()));
            assert!(m.lse[0].is_finite() && m.o[..4].iter().all(|x| x.is_finite()));
        }
    }

    #[test]
    fn refuses_parts_of_the_wrong_size() {
        let ps = PartShape {
            batch: 1,
            n_q: 2,
            heads: 1,
            head_dim: 4,
        };
        let (o, lse) = (vec![0.0; 8], vec![0.0; 3]);
        let e = merge(&ps, &[Part { o: &o, lse: &lse }]).unwrap_err();
        assert!(e.to_string().contains("part 0"), "{e}");
    }
}
