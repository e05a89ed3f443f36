//! The merge kernel: one warp per output row. Every lane folds the parts' LSEs (a few broadcast loads per part), then owns the columns
//! `lane, lane + 32, …` of O and sums the non-empty parts' rows weighted by `exp(LSE_p − LSE)`.
//! Two address modes: a table of part addresses (the public merge) and parts at a fixed stride
//! (the split-KV combine's workspace).

use crate::abi::params::MergeParams;
use crate::abi::storage::{Bf16, F16, Storage};
use crate::arch::{block_dim_x, block_x, thread_x};
use crate::attn::merge::{merged_lse, part_weight};

/// Where part `p`'s O and LSE start.
trait PartAddress {
    fn o(p: &MergeParams, part: u32) -> u64;
    fn lse(p: &MergeParams, part: u32) -> u64;
}

struct Table;
struct Strided;

impl PartAddress for Table {
    #[inline(always)]
    fn o(p: &MergeParams, part: u32) -> u64 {
        p.table.o[part as usize]
    }
    #[inline(always)]
    fn lse(p: &MergeParams, part: u32) -> u64 {
        p.table.lse[part as usize]
    }
}

impl PartAddress for Strided {
    #[inline(always)]
    fn o(p: &MergeParams, part: u32) -> u64 {
        p.o_base + part as u64 * p.o_part_stride
    }
    #[inline(always)]
    fn lse(p: &MergeParams, part: u32) -> u64 {
        p.lse_base + part as u64 * p.lse_part_stride
    }
}

/// Grid `⌈batch·n_q·heads / MERGE_WARPS⌉`, block `32·MERGE_WARPS` (`super::MERGE_WARPS`). Row `r = (b·n_q + i)·heads + h`
/// of O; its LSE is `(b·heads + h)·n_q + i`.
unsafe fn merge<A: PartAddress, In: Storage, Out: Storage>(p: &MergeParams) {
    let lane = thread_x() % 32;
    let row = (block_x() as u64 * block_dim_x() as u64 + thread_x() as u64) / 32;
    let (n_q, heads) = (p.n_q as u64, p.heads as u64);
    if row >= p.batch as u64 * n_q * heads {
        return;
    }
    let (bi, h) = (row / heads, row % heads);
    let (b, i) = (bi / n_q, bi % n_q);
    let lse_index = ((b * heads + h) * n_q + i) as usize;
    let d = p.head_dim as usize;
    let o_index = row as usize * d;
    // SAFETY: the host checked every part against the shape; `lse_index` and `o_index` are rows
    // of it.
    let part_lse = |part: u32| unsafe { *(A::lse(p, part) as *const f32).add(lse_index) };
    let lse = merged_lse((0..p.parts).map(part_lse));
    let out = p.o as *mut Out;
    let mut c = lane as usize;
    while c < d {
        let mut acc = 0.0f32;
        for part in 0..p.parts {
            if let Some(w) = part_weight(part_lse(part), lse) {
                // SAFETY: as above, `o_index + c` is inside the part's O.
                let x = unsafe { *(A::o(p, part) as *const In).add(o_index + c) };
                acc += w * x.to_f32();
            }
        }
        // SAFETY: the output has the parts' shape.
        unsafe { *out.add(o_index + c) = Out::from_f32(acc) };
        c += 32;
    }
    if lane == 0 {
        // SAFETY: as above.
        unsafe { *(p.lse as *mut f32).add(lse_index) = lse };
    }
}

macro_rules! merge_entries {
    ($($name:ident => $mode:ty, $in:ty, $out:ty;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: MergeParams) {
            // SAFETY: the host validated the parts and outputs against `p` before launching.
            unsafe { merge::<$mode, $in, $out>(&p) }
        }
    )*};
}

// Named as `attention_host::instances::merge` formats them.
merge_entries! {
    flash_merge_f32_f32 => Table, f32, f32;
    flash_merge_f16_f16 => Table, F16, F16;
    flash_merge_bf16_bf16 => Table, Bf16, Bf16;
    flash_merge_strided_f32_f32 => Strided, f32, f32;
    flash_merge_strided_f32_f16 => Strided, f32, F16;
    flash_merge_strided_f32_bf16 => Strided, f32, Bf16;
}
