//! The parallel combine of the split-KV partials (`super::DecodeCombine::Parallel`): one block
//! per query row, its warps taking the parts in turn (warp `w`: parts `w, w + warps, …`), so up
//! to [`super::COMBINE_MAX_WARPS`] parts' loads are in flight per row even where ptxas keeps one
//! warp's loads one at a time (it does for the loop over parts: each 16-byte load is used before
//! the next is issued). Every warp first loads all the parts' LSEs at once (`MAX_SPLITS / 32` per
//! lane) and reduces them to the merged LSE with a warp max and a warp sum; then each lane sums
//! its `d/32` contiguous columns of its warp's parts, weighted `exp(LSE_part − LSE)`, and the
//! warps' sums are added in warp order through shared memory. The policy is `attn::merge`'s: a
//! part with `LSE = −∞` contributes nothing (its O is never read), a row empty in every part is
//! `O = 0`, `LSE = −∞`, a NaN LSE makes the row NaN.

use crate::abi::params::MergeParams;
use crate::abi::storage::{Bf16, F16, Storage};
use crate::arch::{block_dim_x, block_x, shared_base, sync_threads, thread_x};

use super::MAX_SPLITS;
use super::parts::{lane_lses, merged_lse, weight};

/// Four f32 columns, one 16-byte load.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Cols4([f32; 4]);

/// Two f32 columns, one 8-byte load.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct Cols2([f32; 2]);

/// The `cols` (4 or 2) f32 at `at` in one vector load, the rest 0.
///
/// # Safety
/// `at .. at + cols` is inside a part's O and `4 · cols`-byte aligned.
#[inline(always)]
unsafe fn load_cols(at: *const f32, cols: usize) -> [f32; 4] {
    // SAFETY: the caller's contract.
    unsafe {
        if cols == 4 {
            (*(at as *const Cols4)).0
        } else {
            let [a, b] = (*(at as *const Cols2)).0;
            [a, b, 0.0, 0.0]
        }
    }
}

/// Grid `batch·n_q·heads` (one block per row), block `32 · super::combine_warps(parts)`, shared
/// `super::combine_shared_bytes(warps, D)`; `p.parts ≤ MAX_SPLITS`, part `q`'s O (f32) at `o_base
/// + q · o_part_stride`, its LSE (f32, natural log) at `lse_base + q · lse_part_stride` (bytes).
/// Row `r = (b·n_q + i)·heads + h` of O; its LSE is `(b·heads + h)·n_q + i` (the merge's layout).
unsafe fn combine<Out: Storage, const D: usize>(p: &MergeParams) {
    const { assert!(D == 64 || D == 128) };
    let cols: usize = const { D / 32 };
    let t = thread_x() as usize;
    let (warp, lane, warps) = (t / 32, t % 32, block_dim_x() as usize / 32);
    let row = block_x() as u64;
    let (n_q, heads) = (p.n_q as u64, p.heads as u64);
    if row >= p.batch as u64 * n_q * heads {
        return;
    }
    let (bi, h) = (row / heads, row % heads);
    let (b, i) = (bi / n_q, bi % n_q);
    let lse_index = ((b * heads + h) * n_q + i) as usize;
    let parts = p.parts.min(MAX_SPLITS) as usize;
    // Read only for `q < parts`: the host checked every part against the shape, and `lse_index`
    // is a row of it.
    let part_lse = |q: usize| {
        ((p.lse_base + q as u64 * p.lse_part_stride) as *const f32).wrapping_add(lse_index)
    };

    // The merged LSE, in every warp alike.
    // SAFETY: q < parts (see `part_lse`).
    let lse = merged_lse(&lane_lses(parts, lane, |q| unsafe { *part_lse(q) }));

    // This warp's parts, the lane's columns `cols·lane ..`.
    let o_index = row as usize * D + cols * lane;
    let mut acc = [0.0f32; 4];
    let mut q = warp;
    while q < parts {
        // SAFETY: q < parts (see `part_lse`).
        let l = unsafe { *part_lse(q) };
        if l != f32::NEG_INFINITY {
            let w = weight(l, lse);
            // SAFETY: `o_index + cols` ≤ the part's O elements, `4 · cols`-byte aligned (rows of
            // D f32, the workspace piece aligned).
            let x = unsafe {
                load_cols(
                    ((p.o_base + q as u64 * p.o_part_stride) as *const f32).add(o_index),
                    cols,
                )
            };
            for (a, &y) in acc.iter_mut().zip(&x) {
                *a += w * y;
            }
        }
        q += warps;
    }
    // The warps' sums, added in warp order.
    // SAFETY: the window holds `warps · D` f32 (super::combine_shared_bytes).
    let sums = shared_base() as *mut f32;
    for (c, &a) in acc.iter().take(cols).enumerate() {
        // SAFETY: inside the window.
        unsafe { *sums.add(warp * D + cols * lane + c) = a };
    }
    sync_threads();
    let out = p.o as *mut Out;
    let mut c = t;
    while c < D {
        let mut o = 0.0;
        for w in 0..warps {
            // SAFETY: inside the window.
            o += unsafe { *sums.add(w * D + c) };
        }
        // SAFETY: the output has the parts' shape.
        unsafe { *out.add(row as usize * D + c) = Out::from_f32(o) };
        c += warps * 32;
    }
    if t == 0 {
        // SAFETY: `lse_index` is a row of the output LSE.
        unsafe { *(p.lse as *mut f32).add(lse_index) = lse };
    }
}

macro_rules! combine_entries {
    ($($name:ident => $out:ty, $d:literal;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: MergeParams) {
            // SAFETY: the host validated the workspace and the outputs against `p`.
            unsafe { combine::<$out, $d>(&p) }
        }
    )*};
}

// Named as `attention_host::instances::decode_combine` formats them.
combine_entries! {
    flash_decode_combine_bf16_d64 => Bf16, 64;
    flash_decode_combine_bf16_d128 => Bf16, 128;
    flash_decode_combine_f16_d64 => F16, 64;
    flash_decode_combine_f16_d128 => F16, 128;
}
