//! FlashAttention-2 backward on the tensor cores (`mma.sync`), in three kernels:
//! 1. `preprocess`: `D = rowsum(dO ∘ O)` and `LSE · log2 e` per row (padded to whole Q blocks),
//!    and zeros the f32 dQ accumulator;
//! 2. `backward`: one thread block per (K/V block, kv-head, batch) loops over the Q blocks of every
//!    query head of its group, recomputes `P`, accumulates dK and dV in registers and adds dQ into
//!    the accumulator with atomics;
//! 3. `convert_dq`: dQ accumulator × scale → storage dtype.
//!
//! This module holds the tile configuration the host and device share.

#[cfg(target_arch = "nvptx64")]
mod mainloop;

use crate::attn::backward::{Q_BLOCK, first_q_block, n_q_pad, needs_mask};

/// Tiles of the main kernel: `warps` warps (4 or 8), each owning 16 keys of the K/V block (so
/// `block_keys = 16 · warps`) for S, dP, dK, dV; Q blocks of 64 rows, of which each warp computes
/// 16 rows of dQ (all columns with 4 warps, half with 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcBackwardConfig {
    pub head_dim: u32,
    pub warps: u32,
}

impl TcBackwardConfig {
    pub const fn block_keys(&self) -> u32 {
        16 * self.warps
    }
    pub const fn block_rows(&self) -> u32 {
        Q_BLOCK
    }
    pub const fn threads(&self) -> u32 {
        32 * self.warps
    }
    /// dQ n-tiles a warp computes and sends to the accumulator at a time: at most 4 (16 registers
    /// beside dK and dV; 8 spilled at d = 128 with 8 warps), at most its share of the columns.
    pub const fn dq_tiles(&self) -> u32 {
        let share = self.head_dim / 8 / (self.warps / 4);
        if share < 4 { share } else { 4 }
    }

    /// `n_q` rounded up to whole Q blocks: the length of each (batch, head) row of the padded
    /// statistics, so every Q block's statistics are whole 16-byte chunks.
    pub const fn n_q_pad(&self, n_q: u32) -> u32 {
        n_q_pad(n_q)
    }

    pub const fn first_q_block(&self, k0: u32, n_q: u32, n_k: u32, causal: bool) -> u32 {
        first_q_block(k0, n_q, n_k, causal)
    }

    pub const fn needs_mask(&self, q0: u32, k0: u32, n_q: u32, n_k: u32, causal: bool) -> bool {
        needs_mask(q0, k0, self.block_keys(), n_q, n_k, causal)
    }

    /// K and V; two stages of Q and dO; `dSᵀ`; two stages of the rows' `LSE · log2 e` and `D`.
    pub const fn shared_bytes(&self) -> u32 {
        let (bc, br, d) = (self.block_keys(), self.block_rows(), self.head_dim);
        2 * bc * d * 2 + 4 * br * d * 2 + bc * br * 2 + 2 * 2 * br * 4
    }
}

/// d = 64 and d = 128: 4 warps, 64 keys × 64 query rows (the `dSᵀ` tile needs at least 64 query
/// columns for its swizzle); two blocks per SM. Not yet measured against the 8-warp variants.
pub const D64: TcBackwardConfig = TcBackwardConfig {
    head_dim: 64,
    warps: 4,
};
pub const D128: TcBackwardConfig = TcBackwardConfig {
    head_dim: 128,
    warps: 4,
};

/// Every configuration compiled into the PTX: the defaults, and with the `tuning` feature the
/// candidates they were measured against (compared by the timing examples).
pub const VARIANTS: &[TcBackwardConfig] = if cfg!(feature = "tuning") {
    &[
        D64,
        D128,
        TcBackwardConfig {
            head_dim: 64,
            warps: 8,
        },
        TcBackwardConfig {
            head_dim: 128,
            warps: 8,
        },
    ]
} else {
    &[D64, D128]
};

/// The configuration for a head dimension (padded as [`super::forward::config`]), `None` where
/// no tensor-core backward runs it.
pub const fn config(head_dim: u32) -> Option<TcBackwardConfig> {
    match crate::kernels::tensor_core_head_dim(head_dim) {
        Some(64) => Some(D64),
        Some(128) => Some(D128),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::shape::allowed_key_end;

    #[test]
    fn visited_blocks_cover_every_allowed_pair_and_unmasked_blocks_hide_none() {
        for cfg in VARIANTS {
            let (br, bc) = (cfg.block_rows(), cfg.block_keys());
            for (n_q, n_k) in [
                (1, 1),
                (17, 17),
                (97, 97),
                (128, 128),
                (77, 300),
                (300, 77),
                (64, 256),
            ] {
                for causal in [false, true] {
                    for k0 in (0..n_k).step_by(bc as usize) {
                        let first = cfg.first_q_block(k0, n_q, n_k, causal);
                        for i in 0..n_q {
                            let end = allowed_key_end(i, n_q, n_k, causal);
                            let sees_block = end > k0;
                            assert!(
                                !sees_block || i / br >= first,
                                "{cfg:?} n_q={n_q} n_k={n_k} causal={causal} k0={k0} row {i}"
                            );
                        }
                        for q0 in (first * br..n_q).step_by(br as usize) {
                            if cfg.needs_mask(q0, k0, n_q, n_k, causal) {
                                continue;
                            }
                            for i in q0..(q0 + br).min(n_q) {
                                let end = allowed_key_end(i, n_q, n_k, causal);
                                assert!(k0 + bc <= end, "{cfg:?} q0={q0} k0={k0} row {i}");
                            }
                        }
                    }
                }
            }
        }
    }
}
