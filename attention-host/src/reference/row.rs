//! One query row of the reference: its allowed keys, scores and softmax, and where its tensors live.

use attention_kernels::abi::shape::{AttentionShape, allowed_key_end};
use attention_kernels::attn::online_state::Real;

use super::dropout::DropoutMask;
use super::sequences::{Sequence, sequences};
use crate::options::AttentionOptions;

/// The inputs of one validated call, with the index arithmetic of the `[batch, seq, heads, dim]`
/// layout.
pub(super) struct Problem<'a> {
    pub shape: AttentionShape,
    pub q: &'a [f64],
    pub k: &'a [f64],
    pub scale: f64,
    pub causal: bool,
    pub dropout: DropoutMask,
    pub sequences: Vec<Sequence>,
}

/// Query row `local` of sequence `seq`, head `head`, with the softmax of its allowed scores.
pub(super) struct Row {
    pub seq: Sequence,
    pub head: u32,
    pub local: u32,
    pub softmax: RowSoftmax,
}

impl<'a> Problem<'a> {
    pub fn new(
        shape: &AttentionShape,
        q: &'a [f64],
        k: &'a [f64],
        options: &AttentionOptions,
    ) -> Self {
        Problem {
            shape: *shape,
            q,
            k,
            scale: options.scale_for(shape.head_dim) as f64,
            causal: options.causal,
            dropout: DropoutMask::new(options),
            sequences: sequences(shape, &options.lengths),
        }
    }

    /// Offset of row `t` of head `h` of batch item `item` in a `[batch, n_q, heads_q, d]` tensor.
    pub fn q_offset(&self, item: u32, t: u32, h: u32) -> usize {
        let s = &self.shape;
        ((item as usize * s.n_q as usize + t as usize) * s.heads_q as usize + h as usize)
            * s.head_dim as usize
    }

    /// Offset of key `t` of K/V head `g` of batch item `item` in a `[batch, n_k, heads_kv, d]` tensor.
    pub fn kv_offset(&self, item: u32, t: u32, g: u32) -> usize {
        let s = &self.shape;
        ((item as usize * s.n_k as usize + t as usize) * s.heads_kv as usize + g as usize)
            * s.head_dim as usize
    }

    /// Index of row `t` of head `h` of batch item `item` in the `[batch, heads_q, n_q]` LSE.
    pub fn lse_index(&self, item: u32, h: u32, t: u32) -> usize {
        let s = &self.shape;
        (item as usize * s.heads_q as usize + h as usize) * s.n_q as usize + t as usize
    }

    /// Offset of the Q/O/dO row of `row`.
    pub fn row_offset(&self, row: &Row) -> usize {
        self.q_offset(row.seq.item, row.seq.q_start + row.local, row.head)
    }

    /// Offset of local key `j` of `row`'s sequence in K/V/dK/dV.
    pub fn key_offset(&self, row: &Row, j: usize) -> usize {
        self.kv_offset(
            row.seq.item,
            row.seq.k_start + j as u32,
            self.shape.kv_head(row.head),
        )
    }

    /// `Z` of local key `j` of `row`.
    pub fn multiplier(&self, row: &Row, j: usize) -> f64 {
        self.dropout
            .multiplier(row.seq.index, row.head, row.local, j as u32)
    }

    /// Every query row of the call, sequence by sequence, head by head.
    pub fn rows(&self) -> impl Iterator<Item = Row> + '_ {
        self.sequences.iter().flat_map(move |&seq| {
            (0..self.shape.heads_q)
                .flat_map(move |head| (0..seq.n_q).map(move |local| self.row(seq, head, local)))
        })
    }

    /// The row of tensor row `t`, head `head`, batch item `item`; `None` outside the shape or the
    /// sequences (rows of a packed tensor beyond the last sequence do not exist).
    pub fn row_at(&self, item: u32, head: u32, t: u32) -> Option<Row> {
        if head >= self.shape.heads_q {
            return None;
        }
        let seq = *self
            .sequences
            .iter()
            .find(|s| s.item == item && (s.q_start..s.q_start + s.n_q).contains(&t))?;
        Some(self.row(seq, head, t - seq.q_start))
    }

    fn row(&self, seq: Sequence, head: u32, local: u32) -> Row {
        let d = self.shape.head_dim as usize;
        let q_off = self.q_offset(seq.item, seq.q_start + local, head);
        let q = &self.q[q_off..q_off + d];
        let end = allowed_key_end(local, seq.n_q, seq.n_k, self.causal);
        let scores = (0..end)
            .map(|j| {
                let k_off = self.kv_offset(seq.item, seq.k_start + j, self.shape.kv_head(head));
                self.scale * dot(q, &self.k[k_off..k_off + d])
            })
            .collect();
        Row {
            seq,
            head,
            local,
            softmax: RowSoftmax::new(scores),
        }
    }
}

/// Softmax over the allowed prefix of a row; a `−∞` score is a masked key.
pub(super) struct RowSoftmax {
    pub scores: Vec<f64>,
    pub probs: Vec<f64>,
    pub lse: f64,
}

impl RowSoftmax {
    pub fn new(scores: Vec<f64>) -> Self {
        let masked = f64::NEG_INFINITY;
        let row_max = scores
            .iter()
            .filter(|s| **s != masked)
            .fold(masked, |m, &s| m.max_nan(s));
        if row_max == masked {
            let probs = vec![0.0; scores.len()];
            return RowSoftmax {
                scores,
                probs,
                lse: masked,
            };
        }
        let shifted: Vec<f64> = scores
            .iter()
            .map(|&s| {
                if s == masked {
                    0.0
                } else {
                    (s - row_max).exp()
                }
            })
            .collect();
        let row_sum: f64 = shifted.iter().sum();
        let probs = shifted.iter().map(|e| e / row_sum).collect();
        RowSoftmax {
            scores,
            probs,
            lse: row_max + row_sum.ln(),
        }
    }

    /// Keys that take part in the row: allowed by the mask and not scored `−∞`.
    pub fn support(&self) -> impl Iterator<Item = (usize, f64)> + '_ {
        self.scores
            .iter()
            .zip(&self.probs)
            .enumerate()
            .filter(|(_, (s, _))| **s != f64::NEG_INFINITY)
            .map(|(j, (_, p))| (j, *p))
    }
}

pub(super) fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
