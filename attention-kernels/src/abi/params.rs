//! Launch parameters of every kernel, `#[repr(C)]` so host and device agree on their layout byte
//! for byte.
//!
//! Tensors are `[batch, seq, heads, head_dim]` (Q, O, dQ, dO with `n_q`, `heads_q`; K, V, dK, dV
//! with `n_k`, `heads_kv`): contiguous, except in the tensor-core kernels, which take each
//! tensor's strides ([`ForwardStrides`], [`BackwardStrides`]). LSE and D are f32 `[batch,
//! heads_q, n_q]`; pointers travel as `u64` device addresses.

use super::layout::{BlockSizes, KeyPages, SequenceLayout, TensorStrides};
use super::philox::DropoutRng;
use super::shape::AttentionShape;
use crate::attn::score_mod::Window;

/// The local window and the score modifiers of a call (semantics in `attn::score_mod`). Arrays
/// are f32 `[heads_q]` device addresses, 0 when the option is off.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ScoreMods {
    pub window: Window,
    /// Softcap `c` of `s ← c·tanh(s / c)`; 0 for none.
    pub softcap: f32,
    /// ALiBi slope per query head.
    pub alibi_slopes: u64,
    /// Sink logit per query head.
    pub sinks: u64,
    /// Backward: `dsink` per query head, accumulated (zeroed by the host); 0 without sinks.
    pub d_sinks: u64,
}

impl ScoreMods {
    /// The softcap and ALiBi slope of query head `h`.
    ///
    /// # Safety
    /// `alibi_slopes`, when set, holds `heads_q > h` f32.
    #[inline(always)]
    pub unsafe fn for_head(&self, h: u32) -> crate::attn::score_mod::ScoreMod<f32> {
        let slope = if self.alibi_slopes == 0 {
            0.0
        } else {
            // SAFETY: caller.
            unsafe { *(self.alibi_slopes as *const f32).add(h as usize) }
        };
        crate::attn::score_mod::ScoreMod {
            softcap: self.softcap,
            slope,
        }
    }

    /// The sink logit of query head `h`, if the call has sinks.
    ///
    /// # Safety
    /// `sinks`, when set, holds `heads_q > h` f32.
    #[inline(always)]
    pub unsafe fn sink(&self, h: u32) -> Option<f32> {
        // SAFETY: caller.
        (self.sinks != 0).then(|| unsafe { *(self.sinks as *const f32).add(h as usize) })
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

/// Where the rows of Q, K, V and O are (the tensor-core forward).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwardStrides {
    pub q: TensorStrides,
    pub k: TensorStrides,
    pub v: TensorStrides,
    pub o: TensorStrides,
}

impl ForwardStrides {
    /// Every tensor contiguous: the library's own tensors.
    pub const fn contiguous(shape: &AttentionShape) -> ForwardStrides {
        let q = TensorStrides::contiguous(shape.n_q, shape.heads_q, shape.head_dim);
        let k = TensorStrides::contiguous(shape.n_k, shape.heads_kv, shape.head_dim);
        let v = TensorStrides::contiguous(shape.n_k, shape.heads_kv, shape.head_dim_v);
        let o = TensorStrides::contiguous(shape.n_q, shape.heads_q, shape.head_dim_v);
        ForwardStrides { q, k, v, o }
    }
}

/// Where the rows of the tensor-core backward's tensors are. The f32 dQ accumulator of the
/// workspace stays contiguous.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackwardStrides {
    pub q: TensorStrides,
    pub k: TensorStrides,
    pub v: TensorStrides,
    pub o: TensorStrides,
    pub d_o: TensorStrides,
    pub dq: TensorStrides,
    pub dk: TensorStrides,
    pub dv: TensorStrides,
}

impl BackwardStrides {
    /// Every tensor contiguous: the library's own tensors.
    pub const fn contiguous(shape: &AttentionShape) -> BackwardStrides {
        let q = TensorStrides::contiguous(shape.n_q, shape.heads_q, shape.head_dim);
        let k = TensorStrides::contiguous(shape.n_k, shape.heads_kv, shape.head_dim);
        let v = TensorStrides::contiguous(shape.n_k, shape.heads_kv, shape.head_dim_v);
        let o = TensorStrides::contiguous(shape.n_q, shape.heads_q, shape.head_dim_v);
        BackwardStrides {
            q,
            k,
            v,
            o,
            d_o: o,
            dq: q,
            dk: k,
            dv: v,
        }
    }
}

/// The tensor-core forward (`kernels::sm80`, `kernels::sm90`): Q, K, V and O are f16 or bf16 `[batch, seq, heads,
/// head_dim]` with the strides of `strides`, LSE is f32 `[batch, heads_q, n_q]` in natural log.
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
    /// Window and score modifiers: the `wgmma` general instances honour them; the host refuses
    /// them for the others.
    pub mods: ScoreMods,
    pub strides: ForwardStrides,
}

/// A CUDA tensor map (`CUtensorMap`): the opaque 128 bytes the driver's
/// `cuTensorMapEncodeTiled` writes, which the tensor memory accelerator reads (`tile::tma`) at
/// 64-byte aligned addresses. Declared 16-byte aligned, the most rustc's NVPTX calling
/// convention gives a kernel parameter: [`TmaForwardParams`] places its maps.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TensorMap(pub [u64; 16]);

/// Bytes ahead of [`TmaForwardParams`]'s tensor maps. On sm_90 a kernel's parameters start at
/// offset 0x210 of constant bank 0, 16 bytes past a multiple of 64; the maps, which the
/// accelerator reads in place, must sit at multiples of 64 (a misplaced one fails the launch
/// with a misaligned address, which `gpu_variants` would show).
pub const TMA_MAPS_OFFSET: usize = 48;

/// The `wgmma` forward's instances that load K and V through the tensor memory accelerator
/// (those without sequences of their own or dropout): K's and V's tensor maps, each over
/// `[batch, n_k, heads_kv, head_dim]` with their strides and boxes of 64 columns by the block's
/// keys, 128-byte swizzled, ahead of the other parameters at [`TMA_MAPS_OFFSET`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TmaForwardParams {
    pub align: [u64; TMA_MAPS_OFFSET / 8],
    pub k_map: TensorMap,
    pub v_map: TensorMap,
    pub base: TensorCoreForwardParams,
}

const _: () = assert!(
    core::mem::offset_of!(TmaForwardParams, k_map) == TMA_MAPS_OFFSET
        && core::mem::offset_of!(TmaForwardParams, v_map) == TMA_MAPS_OFFSET + 128
);

/// The `wgmma` FP8 forward (`kernels::sm90::forward_fp8`): Q, K, V in e4m3 `[batch, seq, heads,
/// head_dim]` (one byte per element, Q's rows at `q_strides`), K and V read through their tensor
/// maps (boxes of 128 one-byte columns by the block's keys, 128-byte swizzled), O in bf16 at
/// `o_strides`, LSE f32 `[batch, heads_q, n_q]`. `descale` points to f32 factors: the Q heads',
/// then the K heads', then the V heads' (`heads_q + 2 · heads_kv`), by which the stored values
/// are multiplied to give the real ones.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Fp8ForwardParams {
    pub align: [u64; TMA_MAPS_OFFSET / 8],
    pub k_map: TensorMap,
    pub v_map: TensorMap,
    pub q: u64,
    pub o: u64,
    pub lse: u64,
    pub descale: u64,
    pub shape: AttentionShape,
    /// `τ · log2 e`, before the descaling factors of Q and K.
    pub scale_log2: f32,
    /// 1 for the causal mask, 0 for none.
    pub causal: u32,
    pub q_strides: TensorStrides,
    pub o_strides: TensorStrides,
    /// V as the accelerator reads it through `v_map`: for the slow path that finds a NaN of V
    /// under the causal mask's diagonal (the kernel's docs).
    pub v: u64,
    pub v_strides: TensorStrides,
}

const _: () = assert!(
    core::mem::offset_of!(Fp8ForwardParams, k_map) == TMA_MAPS_OFFSET
        && core::mem::offset_of!(Fp8ForwardParams, v_map) == TMA_MAPS_OFFSET + 128
);

/// The tensor-core backward (`kernels::sm80::backward`, `kernels::sm90`), one struct for its
/// kernels. Q, K, V, O, dO, dQ, dK, dV are f16 or bf16 `[batch, seq, heads, head_dim]` with the
/// strides of `strides`; `lse` is the forward's f32 `[batch, heads_q, n_q]` (natural log).
/// Workspace, all f32: `dq_accum` contiguous in Q's shape, and `lse_log2`, `d_sum` as `[batch,
/// heads_q, n_q_pad]` (rows padded to whole Q blocks so each block's statistics are whole 16-byte
/// chunks).
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
    /// As in [`TensorCoreForwardParams`]; `d_sinks` is written by `flash_tc_backward_d_sink`.
    pub mods: ScoreMods,
    pub strides: BackwardStrides,
}

/// The `wgmma` backward's main kernels that load Q and dO through the tensor memory accelerator
/// (those without sequences of their own or dropout, `kernels::sm90::tma_loads_backward`): Q's
/// and dO's tensor maps, each over `[batch, n_q, heads_q, head_dim]` in boxes of 64 columns by
/// one Q block's rows, and the f32 dQ accumulator's over the same dims in boxes of 32 columns
/// (128 bytes) by one Q block's rows, which the d = 256 instances add dQ through
/// (`kernels::sm90::bulk_dq`); ahead of the other parameters as in [`TmaForwardParams`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TmaBackwardParams {
    pub align: [u64; TMA_MAPS_OFFSET / 8],
    pub q_map: TensorMap,
    pub do_map: TensorMap,
    pub base: TensorCoreBackwardParams,
    /// After `base`, so that the kernels that do not read it keep their parameters' offsets.
    pub dq_map: TensorMap,
}

/// Bytes from Q's tensor map (the address `tile::tma::param_maps!` gives) to dQ's.
pub const TMA_BACKWARD_DQ_MAP: usize =
    core::mem::offset_of!(TmaBackwardParams, dq_map) - TMA_MAPS_OFFSET;

const _: () = assert!(
    core::mem::offset_of!(TmaBackwardParams, q_map) == TMA_MAPS_OFFSET
        && core::mem::offset_of!(TmaBackwardParams, do_map) == TMA_MAPS_OFFSET + 128
        && TMA_BACKWARD_DQ_MAP.is_multiple_of(64)
);

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
    pub mods: ScoreMods,
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
    pub mods: ScoreMods,
}

/// Most parts one launch of the table merge takes (their addresses travel in the parameters);
/// merging is associative, so more parts merge in stages.
pub const MERGE_MAX_PARTS: usize = 32;

/// Where the parts of a merge are: each part `p` has O `[batch, n_q, heads, head_dim]` (the
/// input dtype) and LSE f32 `[batch, heads, n_q]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MergeParts {
    /// Table mode (`flash_merge_*`): the addresses of the first `parts` parts.
    pub o: [u64; MERGE_MAX_PARTS],
    pub lse: [u64; MERGE_MAX_PARTS],
}

/// The merge of `parts` saved `(O, LSE)` pairs over disjoint key sets into one (`kernels::merge`).
/// The table entry points read the parts' addresses from `table`; the strided ones (the split-KV
/// combine) find part `p` at `o_base + p · o_part_stride` and `lse_base + p · lse_part_stride`
/// (bytes). O out in the output dtype, LSE out f32, same layouts.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MergeParams {
    pub table: MergeParts,
    pub o_base: u64,
    pub lse_base: u64,
    pub o_part_stride: u64,
    pub lse_part_stride: u64,
    pub o: u64,
    pub lse: u64,
    pub parts: u32,
    pub batch: u32,
    pub n_q: u32,
    pub heads: u32,
    pub head_dim: u32,
}

/// The split-KV decode (`kernels::decode`): Q, K, V f16 or bf16 `[batch, seq, heads, head_dim]`
/// (K and V a page pool when `pages` is paged); split `p` writes its partial O (f32, O's layout) at `o_part + p · o_elems` and its partial LSE
/// (f32, natural log, LSE's layout) at `lse_part + p · row_elems` (elements), which
/// [`MergeParams`]' strided combine merges.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DecodeParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o_part: u64,
    pub lse_part: u64,
    /// Full or per-item key lengths (the host refuses packed sequences for this family).
    pub layout: SequenceLayout,
    /// Where each sequence's key rows are: contiguous, or pages of a paged cache.
    pub pages: KeyPages,
    pub shape: AttentionShape,
    /// Keys of one split (a multiple of the kernel's step); split `p` owns keys
    /// `p · keys_per_split .. (p + 1) · keys_per_split` of its sequence.
    pub keys_per_split: u32,
    /// `τ · log2 e`: scores go straight to the base-2 exponent.
    pub scale_log2: f32,
    /// 1 for the causal mask, 0 for none.
    pub causal: u32,
    /// 1 when the splits merge themselves (`DecodeCombine::LastSplit`): the block of a (K/V
    /// head, sequence) that finishes last merges every split's partials into `o` and `lse`, the
    /// others counting themselves at `split_counters`; with one split the block writes `o` and
    /// `lse` directly. 0 when a combine launch follows.
    pub merge_in_kernel: u32,
    /// O (the call's dtype, `[batch, n_q, heads_q, head_dim]`) and LSE (f32) when
    /// `merge_in_kernel` is 1.
    pub o: u64,
    pub lse: u64,
    /// u32 per (sequence, K/V head), index `sequence · heads_kv + head`, zero before the launch
    /// and left zero by it (the last split resets its counter); read only with more than one
    /// split.
    pub split_counters: u64,
}

/// Appending new K/V rows to a cache (`kernels::cache`): `new_k`, `new_v` are `[batch, n_new,
/// heads_kv, head_dim]`; item `b`'s first `new_lengths[b]` rows become its key rows
/// `cache_lengths[b] ..` in `cache_k`, `cache_v` (the same dtype): rows of `[batch, capacity,
/// heads_kv, head_dim]` when `pages` is contiguous, of the page pool when it is paged, and
/// `lengths_out[b]` becomes `cache_lengths[b] + new_lengths[b]` (so a cache's lengths stay on the
/// device). The length arrays are device `u32 [batch]`, `lengths_out` another array than
/// `cache_lengths`; `new_lengths` 0 means every item appends `n_new` rows. Rows are copied as
/// 16-byte chunks.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CacheAppendParams {
    pub cache_k: u64,
    pub cache_v: u64,
    pub new_k: u64,
    pub new_v: u64,
    pub cache_lengths: u64,
    pub new_lengths: u64,
    pub lengths_out: u64,
    pub pages: KeyPages,
    pub batch: u32,
    /// Rows per item of the contiguous layout (unused when paged).
    pub capacity: u32,
    pub n_new: u32,
    /// 16-byte chunks of one row of all K/V heads (`heads_kv · head_dim · element size / 16`).
    pub row_chunks: u32,
}
