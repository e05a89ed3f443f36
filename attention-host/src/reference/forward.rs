//! Reference forward: `O` and `LSE`.

use attention_kernels::abi::shape::AttentionShape;

use super::row::{Problem, Row};
use super::validate::check;
use crate::error::{Result, invalid};
use crate::options::AttentionOptions;

/// `o`: `[batch, n_q, heads_q, head_dim_v]`; `lse`: `[batch, heads_q, n_q]`, `−∞` for rows with no
/// allowed key.
#[derive(Clone, Debug, PartialEq)]
pub struct Forward {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
}

/// Exact attention in f64 for `q` (`[batch, n_q, heads_q, head_dim]`), `k` (`[batch, n_k,
/// heads_kv, head_dim]`) and `v` (`[batch, n_k, heads_kv, head_dim_v]`) under `options`.
pub fn forward(
    shape: &AttentionShape,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    options: &AttentionOptions,
) -> Result<Forward> {
    let problem = checked_problem(shape, q, k, v, options)?;
    let d = shape.head_dim_v as usize;
    let mut o = vec![0.0; shape.o_elems()];
    let mut lse = vec![f64::NEG_INFINITY; shape.row_elems()];
    for row in problem.rows() {
        lse[problem.lse_index(row.seq.item, row.head, row.seq.q_start + row.local)] =
            row.softmax.lse;
        let o_off = problem.row_offset(&row, shape.head_dim_v);
        accumulate_row(&problem, &row, v, &mut o[o_off..o_off + d]);
    }
    Ok(Forward { o, lse })
}

/// `O` of selected rows only, for shapes whose full reference would take too long: each entry of
/// `rows` is `(batch item, query head, query row)` in tensor coordinates; the result holds their
/// `head_dim_v` outputs one after another, equal to the same rows of [`forward`].
pub fn forward_rows(
    shape: &AttentionShape,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    options: &AttentionOptions,
    rows: &[(u32, u32, u32)],
) -> Result<Vec<f64>> {
    let problem = checked_problem(shape, q, k, v, options)?;
    let d = shape.head_dim_v as usize;
    let mut o = vec![0.0; rows.len() * d];
    for (out, &(item, head, t)) in o.chunks_mut(d).zip(rows) {
        let Some(row) = problem.row_at(item, head, t) else {
            return Err(invalid!(
                "row ({item}, {head}, {t}) is outside the shape {shape:?}"
            ));
        };
        accumulate_row(&problem, &row, v, out);
    }
    Ok(o)
}

/// The checked inputs of a forward call as a [`Problem`].
fn checked_problem<'a>(
    shape: &AttentionShape,
    q: &'a [f64],
    k: &'a [f64],
    v: &[f64],
    options: &AttentionOptions,
) -> Result<Problem<'a>> {
    check(
        shape,
        options,
        &[
            ("q", q.len(), AttentionShape::q_elems),
            ("k", k.len(), AttentionShape::k_elems),
            ("v", v.len(), AttentionShape::v_elems),
        ],
    )?;
    Ok(Problem::new(shape, q, k, options))
}

/// `out += Σ_j P_ij Z_ij v_j` over the row's allowed keys.
fn accumulate_row(problem: &Problem, row: &Row, v: &[f64], out: &mut [f64]) {
    for (j, p) in row.softmax.support() {
        let weight = p * problem.multiplier(row, j);
        let v_off = problem.key_offset(row, j, problem.shape.head_dim_v);
        for (o_c, v_c) in out.iter_mut().zip(&v[v_off..]) {
            *o_c += weight * v_c;
        }
    }
}

#[cfg(test)]
#[path = "forward_tests.rs"]
mod tests;
