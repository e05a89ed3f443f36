//! How a call's batch splits into independent sequences (padded items or packed segments).

use attention_kernels::abi::shape::AttentionShape;

use crate::options::Lengths;

/// One sequence: rows `q_start .. q_start + n_q` and keys `k_start .. k_start + n_k` of batch item
/// `item`. `index` is the sequence coordinate of the dropout RNG (the batch item, or the packed
/// sequence's position in `cu_seqlens`); row and column coordinates are local to the sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sequence {
    pub item: u32,
    pub index: u32,
    pub q_start: u32,
    pub n_q: u32,
    pub k_start: u32,
    pub n_k: u32,
}

/// The sequences of a call whose options have been validated against `shape`.
pub fn sequences(shape: &AttentionShape, lengths: &Lengths) -> Vec<Sequence> {
    let padded = |b: u32, n_k: u32| Sequence {
        item: b,
        index: b,
        q_start: 0,
        n_q: shape.n_q,
        k_start: 0,
        n_k,
    };
    match lengths {
        Lengths::Full => (0..shape.batch).map(|b| padded(b, shape.n_k)).collect(),
        Lengths::KeyLengths(lens) => (0..shape.batch)
            .map(|b| padded(b, lens[b as usize]))
            .collect(),
        Lengths::Packed {
            cu_seqlens_q,
            cu_seqlens_k,
        } => (0..cu_seqlens_q.len() - 1)
            .map(|s| Sequence {
                item: 0,
                index: s as u32,
                q_start: cu_seqlens_q[s],
                n_q: cu_seqlens_q[s + 1] - cu_seqlens_q[s],
                k_start: cu_seqlens_k[s],
                n_k: cu_seqlens_k[s + 1] - cu_seqlens_k[s],
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_sequences_follow_cu_seqlens() {
        let shape = AttentionShape {
            batch: 1,
            n_q: 5,
            n_k: 7,
            heads_q: 1,
            heads_kv: 1,
            head_dim: 1,
            head_dim_v: 1,
        };
        let seqs = sequences(
            &shape,
            &Lengths::Packed {
                cu_seqlens_q: vec![0, 2, 2, 5],
                cu_seqlens_k: vec![0, 3, 4, 7],
            },
        );
        let extents: Vec<_> = seqs
            .iter()
            .map(|s| (s.index, s.q_start, s.n_q, s.k_start, s.n_k))
            .collect();
        assert_eq!(extents, [(0, 0, 2, 0, 3), (1, 2, 0, 3, 1), (2, 2, 3, 4, 3)]);
    }

    #[test]
    fn key_lengths_limit_each_item() {
        let shape = AttentionShape {
            batch: 2,
            n_q: 3,
            n_k: 4,
            heads_q: 1,
            heads_kv: 1,
            head_dim: 1,
            head_dim_v: 1,
        };
        let seqs = sequences(&shape, &Lengths::KeyLengths(vec![4, 1]));
        assert_eq!(
            seqs.iter()
                .map(|s| (s.item, s.n_q, s.n_k))
                .collect::<Vec<_>>(),
            [(0, 3, 4), (1, 3, 1)]
        );
    }
}
