//! Launch parameters of every kernel, `#[repr(C)]` so host and device agree on their layout byte
//! for byte.
//!
//! Tensors are contiguous `[batch, seq, heads, head_dim]` (Q, O, dQ, dO with `n_q`, `heads_q`; K,
//! V, dK, dV with `n_k`, `heads_kv`); LSE and D are f32 `[batch, heads_q, n_q]`; pointers travel
//! as `u64` device addresses.

use super::layout::{BlockSizes, SequenceLayout};
use super::philox::DropoutRng;
use super::shape::AttentionShape;

/// Stage 1 of the materialized baseline: `S = τ·QKᵀ`, masked, written as `[batch, heads_q, n_q, n_k]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MaterializedScoresParams {
    pub q: u64,
    pub k: u64,
    pub s: u64,
    pub shape: AttentionShape,
    pub scale: f32,
    /// 1 for the causal mask, 0 for none.
    pub causal: u32,
}

/// Stage 2: row softmax `P = softmax(S)` over `[rows, n_k]`; rows with no allowed key become 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MaterializedSoftmaxParams {
    pub s: u64,
    pub p: u64,
    pub rows: u32,
    pub n_k: u32,
}

/// Stage 3: `O = PV`, O written as `[batch, n_q, heads_q, head_dim]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MaterializedOutputParams {
    pub p: u64,
    pub v: u64,
    pub o: u64,
    pub shape: AttentionShape,
}

/// The tensor-core forward (`kernels::sm80`, `kernels::sm90`): Q, K, V and O are f16 or bf16 `[batch, seq, heads,
/// head_dim]`, LSE is f32 `[batch, heads_q, n_q]` in natural log.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TensorCoreForwardParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    /// Sequences and dropout: the `wgmma` kernels honour them; the `mma.sync` ones run only with
    /// `LENGTHS_FULL` and dropout off (the host refuses anything else for them).
    pub layout: SequenceLayout,
    pub dropout: DropoutRng,
    pub shape: AttentionShape,
    /// `τ · log2 e`: scores go straight to the base-2 exponent.
    pub scale_log2: f32,
    /// 1 for the causal mask, 0 for none.
    pub causal: u32,
}

/// The tensor-core backward (`kernels::sm80::backward`, `kernels::sm90`), one struct for its three kernels. Q, K, V, O, dO,
/// dQ, dK, dV are f16 or bf16 `[batch, seq, heads, head_dim]`; `lse` is the forward's f32
/// `[batch, heads_q, n_q]` (natural log). Workspace, all f32: `dq_accum` with Q's layout, and
/// `lse_log2`, `d_sum` as `[batch, heads_q, n_q_pad]` (rows padded to whole Q blocks so each block's
/// statistics are whole 16-byte chunks).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TensorCoreBackwardParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub d_o: u64,
    pub lse: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
    pub dq_accum: u64,
    pub lse_log2: u64,
    pub d_sum: u64,
    /// Deterministic instances only (0 otherwise): one u32 per (batch, head, Q block), zeroed by
    /// the preprocess, counting the K/V blocks that have added their part of the Q block's dQ
    /// (`attn::backward::dq_semaphore`).
    pub dq_semaphores: u64,
    /// As in [`TensorCoreForwardParams`].
    pub layout: SequenceLayout,
    pub dropout: DropoutRng,
    pub shape: AttentionShape,
    /// `n_q` rounded up to the Q block of the main kernel.
    pub n_q_pad: u32,
    /// `τ`: applied to dK at the end and to dQ by the conversion.
    pub scale: f32,
    /// `τ · log2 e`: scores go straight to the base-2 exponent.
    pub scale_log2: f32,
    /// 1 for the causal mask, 0 for none.
    pub causal: u32,
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
