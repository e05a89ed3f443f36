//! Reference backward: `dQ`, `dK`, `dV` with `D = rowsum(dO ∘ O)` and the forward's dropout replayed.

use attention_kernels::abi::shape::AttentionShape;

use super::row::{Problem, dot};
use super::validate::check;
use crate::error::Result;
use crate::options::AttentionOptions;

/// `dq` has Q's layout, `dk` K's and `dv` V's (summed over the query heads of a GQA group);
/// `d_sinks` one value per query head when the call has sink logits.
#[derive(Clone, Debug, PartialEq)]
pub struct Gradients {
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
    pub d_sinks: Option<Vec<f64>>,
}

/// Gradients of `⟨dO, O⟩` where `O` is [`forward`](super::forward) of the same inputs.
pub fn backward(
    shape: &AttentionShape,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
    options: &AttentionOptions,
) -> Result<Gradients> {
    gradients(shape, (q, k, v), None, d_o, options, Sums::Signed)
}

/// [`backward`] with `D = rowsum(dO ∘ O)` taken from the given `o` (O's layout) instead of the
/// f64 forward: the stored output a kernel's backward reads, rounded to its dtype. Where a row's
/// `dP` and `D` cancel (a row with one visible key has `dS = 0` exactly) the rounding of `O`
/// alone moves `dQ` and `dK`; this is the reference for a backward given that `O`.
pub fn backward_from_output(
    shape: &AttentionShape,
    (q, k, v): (&[f64], &[f64], &[f64]),
    o: &[f64],
    d_o: &[f64],
    options: &AttentionOptions,
) -> Result<Gradients> {
    gradients(shape, (q, k, v), Some(o), d_o, options, Sums::Signed)
}

/// The sums of [`backward_from_output`] with every term replaced by its magnitude (`dS` by
/// `P · (Z · Σ|dO ∘ V| + |D|) · |∂s|`, each product's factors by their absolute values,
/// `dσ` by `Σ P_sink · |D|`): the scale of
/// the rounding error that evaluating those sums in finite precision carries. Where the terms
/// cancel (`dP − D` near 0, as in a row with one visible key) `dQ` and `dK` are far below this
/// scale, and their error is only meaningful measured against it.
pub fn backward_magnitudes_from_output(
    shape: &AttentionShape,
    (q, k, v): (&[f64], &[f64], &[f64]),
    o: &[f64],
    d_o: &[f64],
    options: &AttentionOptions,
) -> Result<Gradients> {
    gradients(shape, (q, k, v), Some(o), d_o, options, Sums::Magnitudes)
}

/// What [`gradients`] sums: the terms, or their magnitudes.
#[derive(Clone, Copy, PartialEq)]
enum Sums {
    Signed,
    Magnitudes,
}

fn gradients(
    shape: &AttentionShape,
    (q, k, v): (&[f64], &[f64], &[f64]),
    given_o: Option<&[f64]>,
    d_o: &[f64],
    options: &AttentionOptions,
    sums: Sums,
) -> Result<Gradients> {
    let mut slices = vec![
        (
            "q",
            q.len(),
            AttentionShape::q_elems as fn(&AttentionShape) -> usize,
        ),
        ("k", k.len(), AttentionShape::k_elems),
        ("v", v.len(), AttentionShape::v_elems),
        ("d_o", d_o.len(), AttentionShape::o_elems),
    ];
    if let Some(o) = given_o {
        slices.push(("o", o.len(), AttentionShape::o_elems));
    }
    check(shape, options, &slices)?;
    let problem = Problem::new(shape, q, k, options);
    let (d, d_v) = (shape.head_dim as usize, shape.head_dim_v as usize);
    let mut dq = vec![0.0; shape.q_elems()];
    let mut dk = vec![0.0; shape.k_elems()];
    let mut dv = vec![0.0; shape.v_elems()];
    let mut d_sinks = problem.sinks.as_ref().map(|s| vec![0.0; s.len()]);
    let mut o = vec![0.0; d_v];
    let magnitudes = sums == Sums::Magnitudes;
    // |x| when summing magnitudes.
    let m = |x: f64| if magnitudes { x.abs() } else { x };
    for row in problem.rows() {
        let (q_off, o_off) = (
            problem.row_offset(&row, shape.head_dim),
            problem.row_offset(&row, shape.head_dim_v),
        );
        let d_o_row = &d_o[o_off..o_off + d_v];
        // (key, P, Z, offset in K/dK, offset in V/dV)
        let support: Vec<(usize, f64, f64, usize, usize)> = row
            .softmax
            .support()
            .map(|(j, p)| {
                (
                    j,
                    p,
                    problem.multiplier(&row, j),
                    problem.key_offset(&row, j, shape.head_dim),
                    problem.key_offset(&row, j, shape.head_dim_v),
                )
            })
            .collect();
        o.fill(0.0);
        for &(_, p, z, _, vo) in &support {
            for c in 0..d_v {
                o[c] += p * z * v[vo + c];
            }
        }
        let row_dot = match given_o {
            Some(given) => dot(d_o_row, &given[o_off..o_off + d_v]),
            None => dot(d_o_row, &o),
        };
        // ∂LSE/∂σ = P_sink, and O moves with every P_j = e^{s_j − LSE}: dσ = −P_sink · D.
        if let Some(d_sinks) = &mut d_sinks {
            let term = row.softmax.sink_prob * row_dot;
            d_sinks[row.head as usize] += if magnitudes { term.abs() } else { -term };
        }
        for &(j, p, z, ko, vo) in &support {
            let ds = if magnitudes {
                let dp: f64 = (0..d_v).map(|c| (d_o_row[c] * v[vo + c]).abs()).sum();
                p * (z * dp + row_dot.abs()) * row.softmax.grad(j).abs()
            } else {
                let dp = z * dot(d_o_row, &v[vo..vo + d_v]);
                p * (dp - row_dot) * row.softmax.grad(j)
            };
            for c in 0..d_v {
                dv[vo + c] += p * z * m(d_o_row[c]);
            }
            for c in 0..d {
                dq[q_off + c] += problem.scale * ds * m(k[ko + c]);
                dk[ko + c] += problem.scale * ds * m(q[q_off + c]);
            }
        }
    }
    Ok(Gradients {
        dq,
        dk,
        dv,
        d_sinks,
    })
}

#[cfg(test)]
#[path = "backward_tests.rs"]
mod tests;
