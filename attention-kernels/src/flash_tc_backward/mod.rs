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
mod backward;
#[cfg(target_arch = "nvptx64")]
mod preprocess;

/// Widening of two packed 16-bit elements, the lower one first (the inverse of `MmaElem::pack`
/// up to its rounding).
#[cfg(target_arch = "nvptx64")]
trait Pair: crate::tile::mma::MmaElem {
    fn unpack(w: u32) -> [f32; 2];
}

#[cfg(target_arch = "nvptx64")]
impl Pair for crate::storage::Bf16 {
    #[inline(always)]
    fn unpack(w: u32) -> [f32; 2] {
        [f32::from_bits(w << 16), f32::from_bits(w & 0xffff_0000)]
    }
}

#[cfg(target_arch = "nvptx64")]
impl Pair for crate::storage::F16 {
    #[inline(always)]
    fn unpack(w: u32) -> [f32; 2] {
        use crate::storage::{F16, Storage};
        [F16(w as u16).to_f32(), F16((w >> 16) as u16).to_f32()]
    }
}

/// Tiles of the main kernel: `warps` warps, each owning 16 keys of the K/V block (so
/// `block_keys = 16 · warps`) for S, dP, dK, dV, and 16 query rows of the Q block
/// (`block_rows = 16 · warps`) for dQ.
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
        16 * self.warps
    }
    pub const fn threads(&self) -> u32 {
        32 * self.warps
    }
    /// K and V; two stages of Q and dO; `dSᵀ`; two stages of the rows' `LSE · log2 e` and `D`.
    pub const fn shared_bytes(&self) -> u32 {
        let (bc, br, d) = (self.block_keys(), self.block_rows(), self.head_dim);
        2 * bc * d * 2 + 4 * br * d * 2 + bc * br * 2 + 2 * 2 * br * 4
    }
}

/// Warps per block of the preprocess kernel, one row per warp.
pub const PREPROCESS_WARPS: u32 = 4;
/// Threads per block of the dQ conversion, eight elements each.
pub const CONVERT_THREADS: u32 = 256;

/// d = 64 and d = 128: 4 warps, 64 keys × 64 query rows (the `dSᵀ` tile needs at least 64 query
/// columns for its swizzle).
pub const D64: TcBackwardConfig = TcBackwardConfig {
    head_dim: 64,
    warps: 4,
};
pub const D128: TcBackwardConfig = TcBackwardConfig {
    head_dim: 128,
    warps: 4,
};

/// The configuration for a head dimension, `None` where no tensor-core backward exists.
pub const fn config(head_dim: u32) -> Option<TcBackwardConfig> {
    match head_dim {
        64 => Some(D64),
        128 => Some(D128),
        _ => None,
    }
}
