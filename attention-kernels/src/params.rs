//! Launch parameters, `#[repr(C)]` so host and device agree on their layout byte for byte.
//!
//! Tensors are contiguous `[batch, seq, heads, head_dim]`; pointers travel as `u64` device addresses.

use crate::flash::params::SequenceLayout;
use crate::philox::DropoutRng;

/// Shape of one attention call. `heads_q % heads_kv == 0` (GQA/MQA when `heads_kv < heads_q`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionShape {
    pub batch: u32,
    pub n_q: u32,
    pub n_k: u32,
    pub heads_q: u32,
    pub heads_kv: u32,
    pub head_dim: u32,
}

impl AttentionShape {
    /// Elements of Q or O.
    pub const fn q_elems(&self) -> usize {
        self.batch as usize * self.n_q as usize * self.heads_q as usize * self.head_dim as usize
    }
    /// Elements of K or V.
    pub const fn kv_elems(&self) -> usize {
        self.batch as usize * self.n_k as usize * self.heads_kv as usize * self.head_dim as usize
    }
    /// Elements of one materialized `[batch, heads_q, n_q, n_k]` score or probability tensor.
    pub const fn score_elems(&self) -> usize {
        self.batch as usize * self.heads_q as usize * self.n_q as usize * self.n_k as usize
    }
    /// Elements of the per-row saved state (`LSE`), laid out `[batch, heads_q, n_q]`.
    pub const fn row_elems(&self) -> usize {
        self.batch as usize * self.heads_q as usize * self.n_q as usize
    }
    /// The K/V head that query head `h` reads: `g(h) = h / (H_q / H_kv)`.
    pub const fn kv_head(&self, h: u32) -> u32 {
        h / (self.heads_q / self.heads_kv)
    }
}

/// Causal alignment: query row `i` may see key `j` iff `j <= i + (n_k - n_q)` (bottom-right
/// aligned, as FlashAttention-2 and PyTorch's `is_causal` with `N_q != N_k` in FA2 do), so the last
/// query row always sees every key. Returns the exclusive end of the allowed key range for row `i`
/// without the key-length limit.
pub const fn causal_key_end(i: u32, n_q: u32, n_k: u32) -> u32 {
    let end = i as i64 + 1 + n_k as i64 - n_q as i64;
    if end < 0 {
        0
    } else if end > n_k as i64 {
        n_k
    } else {
        end as u32
    }
}

/// Exclusive end of the keys query row `i` may see in a sequence of `n_q` rows and `n_k` keys: the
/// allowed keys of every row are the prefix `0 .. allowed_key_end`. For per-item key lengths and
/// packed sequences, `n_q`/`n_k` are that sequence's own counts, so causal alignment follows the
/// keys the sequence really has.
pub const fn allowed_key_end(i: u32, n_q: u32, n_k: u32, causal: bool) -> u32 {
    if causal {
        causal_key_end(i, n_q, n_k)
    } else {
        n_k
    }
}

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

/// The tensor-core forward (`flash_tc`): Q, K, V and O are f16 or bf16 `[batch, seq, heads,
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

/// The tensor-core backward (`flash_tc_backward`), one struct for its three kernels. Q, K, V, O, dO,
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
