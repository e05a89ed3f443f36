//! What the tensor-core backwards (`sm80`, `sm90`) share around their main kernels: the
//! preprocess (`D = rowsum(dO ∘ O)`, `LSE · log2 e` per row, zeroed f32 dQ accumulator), the
//! dQ conversion, the gradients of NaN rows, and the Q blocks of 64 rows whose padding lays out
//! the row statistics.

#[cfg(target_arch = "nvptx64")]
mod nan_rows;
#[cfg(target_arch = "nvptx64")]
mod preprocess;

use crate::abi::shape::allowed_key_end;

/// Query rows per Q block of every tensor-core backward main kernel.
pub const Q_BLOCK: u32 = 64;

/// `n_q` rounded up to whole Q blocks: the length of each (batch, head) row of the padded
/// statistics, so every Q block's statistics are whole 16-byte chunks.
pub const fn n_q_pad(n_q: u32) -> u32 {
    n_q.div_ceil(Q_BLOCK) * Q_BLOCK
}

/// The deterministic backward's count for K/V block `kv_block` and a Q block it visits: how many
/// K/V blocks of the same (sequence, K/V head) add their part of that Q block's dQ before it
/// does. Every earlier K/V block visits each Q block this one visits ([`first_q_block`] does not
/// decrease with the keys), so the count is the block's index: the adds go in key order. A mask
/// that also bounds keys from the left (a local window) breaks that premise: there the count is
/// `kv_block` minus the first K/V block any row of the Q block sees, computed here for every
/// caller.
pub const fn dq_adds_before(kv_block: u32) -> u32 {
    kv_block
}

/// Index of the dQ semaphore of (`bh = batch · heads_q + head`, Q block `q_block`): the padded
/// statistics' layout, one entry per Q block.
pub const fn dq_semaphore(bh: u32, q_block: u32, n_q_pad: u32) -> u64 {
    bh as u64 * (n_q_pad / Q_BLOCK) as u64 + q_block as u64
}

/// The first Q block the K/V block starting at key `k0` visits (it visits every later one
/// too): causally, row i sees key k0 iff i ≥ k0 + n_q − n_k (`causal_key_end`), so earlier
/// blocks contribute nothing.
pub const fn first_q_block(k0: u32, n_q: u32, n_k: u32, causal: bool) -> u32 {
    if causal {
        (k0 + n_q).saturating_sub(n_k) / Q_BLOCK
    } else {
        0
    }
}

/// Whether the (Q block at row `q0`, K/V block at key `k0`) pair holds a pair the row may not
/// see (a causally hidden key or one past `n_k`); `allowed_key_end` grows with the row, so
/// the block's first row decides.
pub const fn needs_mask(
    q0: u32,
    k0: u32,
    block_keys: u32,
    n_q: u32,
    n_k: u32,
    causal: bool,
) -> bool {
    allowed_key_end(q0, n_q, n_k, causal) < k0 + block_keys
}

/// Warps per block of the preprocess kernel, one row per warp.
pub const PREPROCESS_WARPS: u32 = 4;
/// Threads per block of the dQ conversion, eight elements each.
pub const CONVERT_THREADS: u32 = 256;
/// Threads per block of the NaN-row pass, one row each (a warp's NaN rows taken in turn by the
/// whole warp).
pub const NAN_ROWS_THREADS: u32 = 256;

/// Widening of two packed 16-bit elements, the lower one first (the inverse of `MmaElem::pack`
/// up to its rounding).
#[cfg(target_arch = "nvptx64")]
pub(crate) trait Pair: crate::tile::mma::MmaElem {
    fn unpack(w: u32) -> [f32; 2];
}

#[cfg(target_arch = "nvptx64")]
impl Pair for crate::abi::storage::Bf16 {
    #[inline(always)]
    fn unpack(w: u32) -> [f32; 2] {
        [f32::from_bits(w << 16), f32::from_bits(w & 0xffff_0000)]
    }
}

#[cfg(target_arch = "nvptx64")]
impl Pair for crate::abi::storage::F16 {
    #[inline(always)]
    fn unpack(w: u32) -> [f32; 2] {
        use crate::abi::storage::{F16, Storage};
        [F16(w as u16).to_f32(), F16((w >> 16) as u16).to_f32()]
    }
}
