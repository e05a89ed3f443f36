//! Byte ledgers: the materialized three-stage baseline (0x02E) and the saved row state (0x09F).

use attention_kernels::abi::shape::AttentionShape;

/// Stored widths in bytes of each role (0x02D): `b_qkv`, `b_score`, `b_prob`, `b_out`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteWidths {
    pub qkv: u64,
    pub score: u64,
    pub prob: u64,
    pub out: u64,
}

impl ByteWidths {
    /// Every payload stored in `bytes`-wide elements.
    pub const fn uniform(bytes: u64) -> Self {
        ByteWidths {
            qkv: bytes,
            score: bytes,
            prob: bytes,
            out: bytes,
        }
    }
}

/// Visible transfers of the stages `S = QKᵀ`, `P = softmax(S)`, `O = PV`, each a complete payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaterializedBytes {
    pub q_read: u64,
    pub k_read: u64,
    pub s_write: u64,
    pub s_read: u64,
    pub p_write: u64,
    pub p_read: u64,
    pub v_read: u64,
    pub o_write: u64,
}

impl MaterializedBytes {
    pub fn new(shape: &AttentionShape, widths: ByteWidths) -> Self {
        let (q, k, v, o, scores) = (
            shape.q_elems() as u64,
            shape.k_elems() as u64,
            shape.v_elems() as u64,
            shape.o_elems() as u64,
            shape.score_elems() as u64,
        );
        MaterializedBytes {
            q_read: q * widths.qkv,
            k_read: k * widths.qkv,
            s_write: scores * widths.score,
            s_read: scores * widths.score,
            p_write: scores * widths.prob,
            p_read: scores * widths.prob,
            v_read: v * widths.qkv,
            o_write: o * widths.out,
        }
    }

    /// The quadratic write-read cycles of `S` and `P`, the part FlashAttention removes.
    pub fn quadratic(&self) -> u64 {
        self.s_write + self.s_read + self.p_write + self.p_read
    }

    pub fn total(&self) -> u64 {
        self.q_read + self.k_read + self.v_read + self.o_write + self.quadratic()
    }
}

/// One f32 `LSE` per (batch, head, row).
pub fn lse_bytes(shape: &AttentionShape) -> u64 {
    shape.row_elems() as u64 * 4
}

/// Separate f32 `m` and `l` per row, as the paper's Algorithm 2 saves them.
pub fn row_stats_bytes(shape: &AttentionShape) -> u64 {
    2 * lse_bytes(shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    /// 0x02F: B = 1, H = 32, N = 4096, d = 128, 2-byte storage.
    fn running_fixture() -> AttentionShape {
        AttentionShape {
            batch: 1,
            n_q: 4096,
            n_k: 4096,
            heads_q: 32,
            heads_kv: 32,
            head_dim: 128,
            head_dim_v: 128,
        }
    }

    #[test]
    fn running_fixture_is_4_125_gib() {
        let b = MaterializedBytes::new(&running_fixture(), ByteWidths::uniform(2));
        for payload in [b.q_read, b.k_read, b.v_read, b.o_write] {
            assert_eq!(payload, 32 * MIB);
        }
        for payload in [b.s_write, b.s_read, b.p_write, b.p_read] {
            assert_eq!(payload, GIB);
        }
        assert_eq!(b.quadratic(), 4 * GIB);
        assert_eq!(b.total(), 4 * GIB + 128 * MIB);
        assert_eq!(b.total() as f64 / GIB as f64, 4.125);
    }

    #[test]
    fn saved_row_state_of_the_running_fixture() {
        assert_eq!(lse_bytes(&running_fixture()), 524_288);
        assert_eq!(lse_bytes(&running_fixture()), MIB / 2);
        assert_eq!(row_stats_bytes(&running_fixture()), MIB);
    }

    #[test]
    fn widths_and_gqa_count_separately() {
        let shape = AttentionShape {
            batch: 2,
            n_q: 3,
            n_k: 5,
            heads_q: 4,
            heads_kv: 2,
            head_dim: 8,
            head_dim_v: 8,
        };
        let b = MaterializedBytes::new(
            &shape,
            ByteWidths {
                qkv: 2,
                score: 4,
                prob: 2,
                out: 4,
            },
        );
        assert_eq!(
            (b.q_read, b.k_read, b.o_write),
            (2 * 3 * 4 * 8 * 2, 2 * 5 * 2 * 8 * 2, 2 * 3 * 4 * 8 * 4)
        );
        assert_eq!(
            (b.s_write, b.p_read),
            (2 * 4 * 3 * 5 * 4, 2 * 4 * 3 * 5 * 2)
        );
    }
}
