//! One query row of the reference: its allowed keys, scores and softmax, and where its tensors live.

use attention_kernels::abi::shape::AttentionShape;
use attention_kernels::attn::online_state::Real;
use attention_kernels::attn::score_mod::{ScoreMod, Window, key_range, with_sink};

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
    pub window: Window,
    pub softcap: f64,
    pub alibi_slopes: Option<Vec<f64>>,
    pub sinks: Option<Vec<f64>>,
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
            window: options.window_or_none(),
            softcap: options.softcap.unwrap_or(0.0) as f64,
            alibi_slopes: widen(&options.alibi_slopes),
            sinks: widen(&options.sinks),
            dropout: DropoutMask::new(options),
            sequences: sequences(shape, &options.lengths),
        }
    }

    /// Offset of row `t` of head `h` of batch item `item` in a `[batch, n_q, heads_q, dim]`
    /// tensor (`dim`: `head_dim` for Q and dQ, `head_dim_v` for O and dO).
    pub fn q_offset(&self, item: u32, t: u32, h: u32, dim: u32) -> usize {
        let s = &self.shape;
        ((item as usize * s.n_q as usize + t as usize) * s.heads_q as usize + h as usize)
            * dim as usize
    }

    /// Offset of key `t` of K/V head `g` of batch item `item` in a `[batch, n_k, heads_kv, dim]`
    /// tensor (`dim`: `head_dim` for K and dK, `head_dim_v` for V and dV).
    pub fn kv_offset(&self, item: u32, t: u32, g: u32, dim: u32) -> usize {
        let s = &self.shape;
        ((item as usize * s.n_k as usize + t as usize) * s.heads_kv as usize + g as usize)
            * dim as usize
    }

    /// Index of row `t` of head `h` of batch item `item` in the `[batch, heads_q, n_q]` LSE.
    pub fn lse_index(&self, item: u32, h: u32, t: u32) -> usize {
        let s = &self.shape;
        (item as usize * s.heads_q as usize + h as usize) * s.n_q as usize + t as usize
    }

    /// Offset of the Q/dQ row of `row` (O/dO with `dim = head_dim_v`).
    pub fn row_offset(&self, row: &Row, dim: u32) -> usize {
        self.q_offset(row.seq.item, row.seq.q_start + row.local, row.head, dim)
    }

    /// Offset of local key `j` of `row`'s sequence in K/dK (V/dV with `dim = head_dim_v`).
    pub fn key_offset(&self, row: &Row, j: usize, dim: u32) -> usize {
        self.kv_offset(
            row.seq.item,
            row.seq.k_start + j as u32,
            self.shape.kv_head(row.head),
            dim,
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
        let dim = self.shape.head_dim;
        let d = dim as usize;
        let q_off = self.q_offset(seq.item, seq.q_start + local, head, dim);
        let q = &self.q[q_off..q_off + d];
        let (start, end) = key_range(local, seq.n_q, seq.n_k, self.causal, self.window);
        let score_mod = self.score_mod(head);
        let (scores, grads) = (0..end)
            .map(|j| {
                if j < start {
                    return (f64::NEG_INFINITY, 0.0);
                }
                let k_off =
                    self.kv_offset(seq.item, seq.k_start + j, self.shape.kv_head(head), dim);
                let s = self.scale * dot(q, &self.k[k_off..k_off + d]);
                score_mod.apply(s, local, j, seq.n_q, seq.n_k)
            })
            .unzip();
        let sink = self.sinks.as_ref().map(|s| s[head as usize]);
        Row {
            seq,
            head,
            local,
            softmax: RowSoftmax::new(scores, grads, sink),
        }
    }

    fn score_mod(&self, head: u32) -> ScoreMod<f64> {
        ScoreMod {
            softcap: self.softcap,
            slope: self.alibi_slopes.as_ref().map_or(0.0, |s| s[head as usize]),
        }
    }
}

fn widen(values: &Option<Vec<f32>>) -> Option<Vec<f64>> {
    values
        .as_ref()
        .map(|v| v.iter().map(|&x| x as f64).collect())
}

/// Softmax over the keys `0 .. end` of a row (keys the window cuts off before the row's start
/// are scored `−∞`); a `−∞` score is a masked key. With a sink logit the denominator includes
/// `e^sink`.
pub(super) struct RowSoftmax {
    /// Modified scores.
    pub scores: Vec<f64>,
    /// `∂s'/∂s` of each modified score (1 without a softcap).
    pub grads: Vec<f64>,
    pub probs: Vec<f64>,
    pub lse: f64,
    /// `e^{sink − LSE}`, the sink's share of the denominator (0 without a sink).
    pub sink_prob: f64,
}

impl RowSoftmax {
    pub fn new(scores: Vec<f64>, grads: Vec<f64>, sink: Option<f64>) -> Self {
        let masked = f64::NEG_INFINITY;
        let row_max = scores
            .iter()
            .filter(|s| **s != masked)
            .fold(masked, |m, &s| m.max_nan(s));
        if row_max == masked {
            let probs = vec![0.0; scores.len()];
            return RowSoftmax {
                scores,
                grads,
                probs,
                lse: sink.unwrap_or(masked),
                sink_prob: if sink.is_some() { 1.0 } else { 0.0 },
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
        let (lse, factor) = match sink {
            Some(sink) => with_sink(row_max, row_sum, sink),
            None => (row_max + row_sum.ln(), 1.0 / row_sum),
        };
        let probs = shifted.iter().map(|e| e * factor).collect();
        RowSoftmax {
            scores,
            grads,
            probs,
            lse,
            sink_prob: sink.map_or(0.0, |sink| (sink - lse).exp()),
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

    /// `∂s'/∂s` of key `j` of the row.
    pub fn grad(&self, j: usize) -> f64 {
        self.grads[j]
    }
}

pub(super) fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
