//! The kernel families, siblings over `attn` and `tile`: `simt` (the exact kernels), `sm80`
//! (`mma.sync`), `sm90` (`wgmma`, the `sm_90a` module only), `decode` (split-KV, few query
//! rows), and what serves them all: `cache` (the KV cache's append), `merge` (combining saved
//! `(O, LSE)` parts) and `baseline` (the materialized three-stage reference kernels). Each
//! family's module holds its tile configurations, which the host plans with; the kernels exist
//! only in the device build.

#[cfg(target_arch = "nvptx64")]
mod baseline;
pub mod cache;
pub mod decode;
pub mod merge;
pub mod simt;
pub mod sm80;
pub mod sm90;

/// The largest head dim the tensor-core families (`sm80`, `sm90`) run, forward and backward.
pub const MAX_TENSOR_CORE_HEAD_DIM: u32 = 256;
/// The widest head-dim slice of the tensor-core backward's dK, dV and dQ. Their accumulators take
/// `d / 2` registers per thread each in both families (16 keys per `mma.sync` warp, 64 per
/// warpgroup), so past d = 128 (192 and 256 registers alone, of 255) each slice of at most 128
/// columns has its own warps (`sm80`) or warpgroup (`sm90`) over the block's keys, which all
/// recompute `Sᵀ` and `dPᵀ` over the whole head dim: in `sm80` d = 192 is a slice of 128 and one
/// of 64, in `sm90` two of 96 (`WgBackwardConfig::slice_cols`), d = 256 two of 128 in both.
pub const BACKWARD_SLICE_COLS: u32 = 128;

/// The compiled head dim that runs a tensor-core call of head dim `head_dim`: the next multiple
/// of 64 (their shared tiles are rows of whole 128-byte swizzle lines, so no instance between:
/// 64, 128, 192 and 256), for every multiple of 8 from 32 to [`MAX_TENSOR_CORE_HEAD_DIM`]. The
/// loads fill the columns past the real head dim with zeros (zero columns change no product)
/// and the stores leave them out; `None` where no instance runs it. Forward and backward alike.
pub const fn tensor_core_head_dim(head_dim: u32) -> Option<u32> {
    if head_dim >= 32 && head_dim <= MAX_TENSOR_CORE_HEAD_DIM && head_dim.is_multiple_of(8) {
        Some(head_dim.next_multiple_of(64))
    } else {
        None
    }
}
