//! Launch parameters of the tiled kernels, `#[repr(C)]` so host and device agree byte for byte.
//!
//! Tensors Q, O, dQ, dO are `[batch, n_q, heads_q, head_dim]`, K, V, dK, dV are
//! `[batch, n_k, heads_kv, head_dim]`; LSE and D are f32 `[batch, heads_q, n_q]`.

use crate::params::AttentionShape;
use crate::philox::DropoutRng;

/// Every batch item sees all `n_k` keys.
pub const LENGTHS_FULL: u32 = 0;
/// Batch item `b` sees keys `0 .. key_lengths[b]`.
pub const LENGTHS_KEY: u32 = 1;
/// One batch item of packed sequences delimited by `cu_seqlens_q` / `cu_seqlens_k`.
pub const LENGTHS_PACKED: u32 = 2;

/// How rows and keys split into sequences. Pointers are device addresses of `u32` arrays (0 when
/// the mode does not use them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SequenceLayout {
    pub key_lengths: u64,
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    pub mode: u32,
    /// Batch items, or packed sequences.
    pub sequences: u32,
}

/// Tile extents: `B_r` query rows by `B_c` keys.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSizes {
    pub block_rows: u32,
    pub block_cols: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FlashForwardParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    /// O in the storage dtype; LSE in f32. Written once, by the row-owned kernel or by the paper
    /// schedule's last launch.
    pub o: u64,
    pub lse: u64,
    /// Paper schedule only: normalised O (f32, layout of O), ℓ and m (f32, layout of LSE) kept in
    /// global memory between the launches of consecutive K/V blocks.
    pub o_state: u64,
    pub row_sum: u64,
    pub row_max: u64,
    pub layout: SequenceLayout,
    pub dropout: DropoutRng,
    pub shape: AttentionShape,
    pub blocks: BlockSizes,
    pub scale: f32,
    pub causal: u32,
    /// Paper schedule: the K/V block `j` this launch merges, and 1 on the last launch.
    pub kv_block: u32,
    pub last: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FlashBackwardParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub d_o: u64,
    pub lse: u64,
    /// `D = rowsum(dO ∘ O)`, f32, layout of LSE.
    pub delta: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
    /// f32 dQ accumulated with atomics by the K/V-outer kernel; 0 when a separate row-owned dQ
    /// pass computes dQ instead (the deterministic option).
    pub dq_accum: u64,
    pub layout: SequenceLayout,
    pub dropout: DropoutRng,
    pub shape: AttentionShape,
    pub blocks: BlockSizes,
    pub scale: f32,
    pub causal: u32,
}
