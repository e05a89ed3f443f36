//! The split-KV combine: parts at a fixed stride (the decode family's f32 partials), one block
//! per output row. A thread per part reads the parts' LSEs at once (one round trip, not one per
//! part); then each thread owns four columns of O for every `groups`-th part and issues four
//! parts' 16-byte loads before using them; the groups' sums are added in shared memory.

use crate::abi::params::MergeParams;
use crate::abi::storage::{Bf16, F16, Storage};
use crate::arch::{block_x, exp2, log2, shared_base, shfl_xor, sync_threads, thread_x};
use crate::attn::mask::{MASKED, contribution};
use crate::attn::online_state::Real;

use super::{COMBINE_THREADS, COMBINE_WARPS};

/// Four f32 of a partial O row, one 16-byte load.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct F4([f32; 4]);

/// Parts whose loads one thread issues before using them.
const BATCH: u32 = 4;

/// Block-wide reduction of one value per thread through `red` (`COMBINE_WARPS` f32); every
/// thread gets the result. `op` is applied across lanes, then across warps.
#[inline(always)]
fn block_reduce(x: f32, red: *mut f32, op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut x = x;
    let mut m = 16;
    while m > 0 {
        x = op(x, shfl_xor(x, m));
        m >>= 1;
    }
    let t = thread_x() as usize;
    if t % 32 == 0 {
        // SAFETY: inside the reduction slots.
        unsafe { *red.add(t / 32) = x };
    }
    sync_threads();
    // SAFETY: as above.
    let mut y = unsafe { *red };
    for w in 1..COMBINE_WARPS as usize {
        y = op(y, unsafe { *red.add(w) });
    }
    sync_threads();
    y
}

/// Grid `batch·n_q·heads`, block [`COMBINE_THREADS`], shared `super::combine_shared_bytes`;
/// `parts <= COMBINE_THREADS`, `head_dim % 4 == 0`, `head_dim <= 4 · COMBINE_THREADS`. Row
/// `r = (b·n_q + i)·heads + h` of O; its LSE is `(b·heads + h)·n_q + i`. Same policy as the
/// public merge (`attn::merge`): empty parts (`LSE = −∞`) are skipped, all empty gives `O = 0`,
/// `LSE = −∞`, a NaN LSE makes the row NaN.
unsafe fn combine<Out: Storage>(p: &MergeParams) {
    let t = thread_x();
    let row = block_x() as u64;
    let (n_q, heads) = (p.n_q as u64, p.heads as u64);
    let (bi, h) = (row / heads, row % heads);
    let (b, i) = (bi / n_q, bi % n_q);
    let lse_index = (b * heads + h) * n_q + i;
    let d = p.head_dim as u64;
    let weight = shared_base() as *mut f32;
    // SAFETY: the window holds COMBINE_THREADS weights, COMBINE_WARPS reduction slots and
    // COMBINE_THREADS · 4 sums (`super::combine_shared_bytes`).
    let (red, sums) = unsafe {
        let red = weight.add(COMBINE_THREADS as usize);
        (red, red.add(COMBINE_WARPS as usize))
    };
    // The merged LSE, in base 2: the parts' maximum (NaN kept), then the sum of the weights.
    let log2e = core::f32::consts::LOG2_E;
    let part_lse = if t < p.parts {
        // SAFETY: part t < parts of the workspace, row `lse_index` of its LSE.
        unsafe {
            *((p.lse_base + t as u64 * p.lse_part_stride) as *const f32).add(lse_index as usize)
        }
    } else {
        f32::NEG_INFINITY
    };
    let empty = part_lse == f32::NEG_INFINITY;
    let x = part_lse * log2e;
    let m = block_reduce(if empty { f32::NEG_INFINITY } else { x }, red, |a, b| {
        a.max_nan(b)
    });
    let all_empty = m == f32::NEG_INFINITY;
    let e = if empty || all_empty { 0.0 } else { exp2(x - m) };
    let sum = block_reduce(e, red, |a, b| a + b);
    let lse2 = if all_empty {
        f32::NEG_INFINITY
    } else {
        m + log2(sum)
    };
    // SAFETY: inside the weights.
    unsafe {
        *weight.add(t as usize) = if empty || all_empty {
            MASKED
        } else {
            exp2(x - lse2)
        }
    };
    sync_threads();
    // O: thread t owns columns `4c .. 4c + 4` of every `groups`-th part, `c = t % (d/4)`.
    let quads = (d / 4) as u32;
    let groups = COMBINE_THREADS / quads;
    let (c, g) = (t % quads, t / quads);
    let mut acc = [0.0f32; 4];
    if g < groups {
        let o_at = |part: u32| {
            (p.o_base + part as u64 * p.o_part_stride + 4 * (row * d + 4 * c as u64)) as *const F4
        };
        let mut part = g;
        while part < p.parts {
            let mut batch = [[0.0f32; 4]; BATCH as usize];
            let mut w = [MASKED; BATCH as usize];
            for k in 0..BATCH as usize {
                let q = part + k as u32 * groups;
                if q < p.parts {
                    // SAFETY: inside the weights.
                    w[k] = unsafe { *weight.add(q as usize) };
                    if w[k].to_bits() != MASKED.to_bits() {
                        // SAFETY: part q < parts, row `row` of its O, columns inside d.
                        batch[k] = unsafe { (*o_at(q)).0 };
                    }
                }
            }
            for k in 0..BATCH as usize {
                for (a, &y) in acc.iter_mut().zip(&batch[k]) {
                    *a += contribution(w[k], y);
                }
            }
            part += BATCH * groups;
        }
        for (e, &a) in acc.iter().enumerate() {
            // SAFETY: inside the sums (g < groups, 4c + e < d).
            unsafe { *sums.add((g * 4 * quads + 4 * c) as usize + e) = a };
        }
    }
    sync_threads();
    let out = p.o as *mut Out;
    let mut col = t as u64;
    while col < d {
        let mut o = 0.0;
        for g in 0..groups as u64 {
            // SAFETY: inside the sums.
            o += unsafe { *sums.add((g * d + col) as usize) };
        }
        // SAFETY: the output has the parts' shape.
        unsafe { *out.add((row * d + col) as usize) = Out::from_f32(o) };
        col += COMBINE_THREADS as u64;
    }
    if t == 0 {
        // SAFETY: as above.
        unsafe { *(p.lse as *mut f32).add(lse_index as usize) = lse2 * core::f32::consts::LN_2 };
    }
}

macro_rules! combine_entries {
    ($($name:ident => $out:ty;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: MergeParams) {
            // SAFETY: the host validated the workspace and outputs against `p` before launching.
            unsafe { combine::<$out>(&p) }
        }
    )*};
}

// Named as `attention_host::instances::merge(F32, _, true)` formats them.
combine_entries! {
    flash_merge_strided_f32_f32 => f32;
    flash_merge_strided_f32_f16 => F16;
    flash_merge_strided_f32_bf16 => Bf16;
}
