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
#[cfg(target_arch = "nvptx64")]
mod sliced;

use crate::attn::backward::{Q_BLOCK, first_q_block, n_q_pad, needs_mask};
use crate::kernels::BACKWARD_SLICE_COLS;

/// Tiles of the main kernel: `warps` warps (4 or 8), each owning 16 keys of the K/V block (so
/// `block_keys = 16 · warps`) for S, dP, dK, dV; Q blocks of 64 rows, of which each warp computes
/// 16 rows of dQ (all columns with 4 warps, half with 8). Past d = 128 the block is [`sliced`]:
/// 64 keys, warps `w` and `w + 4` own the same 16, warp `w` the head-dim slice `w / 4` of their
/// dK, dV and dQ ([`BACKWARD_SLICE_COLS`]).
///
/// [`sliced`]: TcBackwardConfig::sliced
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcBackwardConfig {
    pub head_dim: u32,
    pub warps: u32,
}

impl TcBackwardConfig {
    /// Whether the warps split the head dim (a slice per 4 warps) as well as the keys.
    pub const fn sliced(&self) -> bool {
        self.head_dim > BACKWARD_SLICE_COLS
    }
    pub const fn block_keys(&self) -> u32 {
        if self.sliced() { 64 } else { 16 * self.warps }
    }
    /// Columns of dK and dV each warp accumulates: all, or (sliced) a slice's.
    pub const fn slice_cols(&self) -> u32 {
        if self.sliced() {
            BACKWARD_SLICE_COLS
        } else {
            self.head_dim
        }
    }
    /// `dSᵀ` tiles: one, or (sliced) one per slice, each written and read by its own warps.
    pub const fn ds_tiles(&self) -> u32 {
        if self.sliced() { self.warps / 4 } else { 1 }
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
        let share = if self.sliced() {
            self.slice_cols() / 8
        } else {
            self.head_dim / 8 / (self.warps / 4)
        };
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

    /// Shared stages of Q, dO and their rows' statistics: two, or one at d = 256, so that it
    /// fits in the A100's 163 KiB per block (two take 209 KiB).
    pub const fn stages(&self) -> u32 {
        if self.head_dim > 192 { 1 } else { 2 }
    }

    /// K and V; the stages of Q and dO; the `dSᵀ` tiles; the stages of the rows' `LSE · log2 e`
    /// and `D`.
    pub const fn shared_bytes(&self) -> u32 {
        let (bc, br, d, st) = (
            self.block_keys(),
            self.block_rows(),
            self.head_dim,
            self.stages(),
        );
        2 * bc * d * 2 + st * 2 * br * d * 2 + self.ds_tiles() * bc * br * 2 + st * 2 * br * 4
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
/// d = 192 and 256: 8 warps, 64 keys × 64 query rows, two head-dim slices (128 + 64 and
/// 128 + 128 columns): 161 KiB of shared memory (two stages) and 144.5 KiB (one), inside the
/// A100's 163 KiB per block.
pub const D192: TcBackwardConfig = TcBackwardConfig {
    head_dim: 192,
    warps: 8,
};
pub const D256: TcBackwardConfig = TcBackwardConfig {
    head_dim: 256,
    warps: 8,
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
        D192,
        D256,
    ]
} else {
    &[D64, D128, D192, D256]
};

/// The configuration for a head dimension (padded as [`super::forward::config`]), `None` where
/// no tensor-core backward runs it.
pub const fn config(head_dim: u32) -> Option<TcBackwardConfig> {
    match crate::kernels::tensor_core_head_dim(head_dim) {
        Some(64) => Some(D64),
        Some(128) => Some(D128),
        Some(192) => Some(D192),
        Some(256) => Some(D256),
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
