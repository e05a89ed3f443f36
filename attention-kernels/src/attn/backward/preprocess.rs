//! Kernels 1 and 3 of the backward: per-row statistics before the main kernel, dQ conversion
//! after it.

use crate::abi::layout::TensorStrides;
use crate::abi::params::TensorCoreBackwardParams;
use crate::abi::storage::{Bf16, F16};
use crate::arch::{block_dim_x, block_x, thread_x, warp_sum};
use crate::attn::backward::{PREPROCESS_WARPS, Pair, Q_BLOCK, dq_semaphore};
use crate::attn::score_mod::sink_gradient;
use crate::tile::mem::store_global_16;
use crate::tile::mma::MmaElem;

/// One warp per padded row `(b, h, i)` of `[batch, heads_q, n_q_pad]`: `D_i = Σ dO ∘ O` in f32,
/// `LSE_i · log2 e`, and zeros for row i of the dQ accumulator. Padding rows (`i ≥ n_q`), rows
/// with no allowed key (`LSE = −∞`) and NaN rows (`LSE` NaN) get `LSE · log2 e = +∞` and `D = 0`,
/// so the main kernel's `P = 2^(S·τ·log2 e − LSE·log2 e)` and `dS = P ∘ (dP − D)` are 0 there
/// without a test: a NaN row's gradients are the work of [`super::nan_rows`], which knows which
/// of its keys leave its support. `W = d / 64` words per lane, `d` the compiled head dim: of a
/// padded call only the real head dims' words exist (and count): Q's for the accumulator, V's
/// for O and dO.
#[inline(always)]
unsafe fn preprocess<T: Pair, const W: usize>(p: &TensorCoreBackwardParams) {
    let s = p.shape;
    let lane = thread_x() % 32;
    // Padded rows can pass 2^32 (tiny n_q, many heads); `bh < batch · heads_q < 2^31`.
    let row = block_x() as u64 * PREPROCESS_WARPS as u64 + (thread_x() / 32) as u64;
    let rows = s.batch as u64 * s.heads_q as u64 * p.n_q_pad as u64;
    if row >= rows {
        return;
    }
    let (bh, i) = (
        (row / p.n_q_pad as u64) as u32,
        (row % p.n_q_pad as u64) as u32,
    );
    let (b, h) = (bh / s.heads_q, bh % s.heads_q);
    let (lse_log2, d_sum) = (p.lse_log2 as *mut f32, p.d_sum as *mut f32);
    if p.dq_semaphores != 0 && lane == 0 && i.is_multiple_of(Q_BLOCK) {
        // SAFETY: the deterministic instances' semaphores cover every (bh, Q block).
        unsafe {
            *(p.dq_semaphores as *mut u32).add(dq_semaphore(bh, i / Q_BLOCK, p.n_q_pad) as usize) =
                0
        };
    }
    if i >= s.n_q {
        if lane == 0 {
            // SAFETY: `row` indexes the padded statistics.
            unsafe {
                *lse_log2.add(row as usize) = f32::INFINITY;
                *d_sum.add(row as usize) = 0.0;
            }
        }
        return;
    }
    // Words of a dQ-accumulator row (Q's head dim) and of an O and dO row (V's).
    let (q_words, v_words) = (s.head_dim as usize / 2, s.head_dim_v as usize / 2);
    // The accumulator is contiguous; O and dO have their strides (whole 16-byte chunks, so their
    // element offsets are even).
    let elem = TensorStrides::contiguous(s.n_q, s.heads_q, s.head_dim).offset(b, i, h) as usize;
    let (o_word, d_o_word) = (
        (p.strides.o.offset(b, i, h) / 2) as usize,
        (p.strides.d_o.offset(b, i, h) / 2) as usize,
    );
    let (o, d_o) = (p.o as *const u32, p.d_o as *const u32);
    let acc = p.dq_accum as *mut f32;
    let mut dot = 0.0f32;
    for w in 0..W {
        let at = w * 32 + lane as usize;
        if at >= q_words.max(v_words) {
            break;
        }
        // Consecutive lanes read consecutive words: one coalesced row.
        let word = elem / 2 + at;
        // SAFETY: the words are inside their rows of O, dO and the accumulator (validated by
        // the host).
        unsafe {
            if at < v_words {
                let (x, y) = (
                    T::unpack(*o.add(o_word + at)),
                    T::unpack(*d_o.add(d_o_word + at)),
                );
                dot += x[0] * y[0] + x[1] * y[1];
            }
            if at < q_words {
                *acc.add(2 * word) = 0.0;
                *acc.add(2 * word + 1) = 0.0;
            }
        }
    }
    let dot = warp_sum(dot);
    if lane == 0 {
        // SAFETY: `row` indexes the padded statistics; `bh · n_q + i` the forward's LSE.
        unsafe {
            let lse = *(p.lse as *const f32).add(bh as usize * s.n_q as usize + i as usize);
            let empty = lse == f32::NEG_INFINITY || lse.is_nan();
            *lse_log2.add(row as usize) = if empty {
                f32::INFINITY
            } else {
                lse * core::f32::consts::LOG2_E
            };
            *d_sum.add(row as usize) = if empty { 0.0 } else { dot };
        }
    }
}

/// `dσ_h` of the sink logits (`score_mod::sink_gradient`) after the preprocess, from the
/// forward's LSE and the padded `D`. Grid `(heads_q)`, one warp each.
unsafe fn d_sink(p: &TensorCoreBackwardParams) {
    let s = p.shape;
    let h = block_x();
    // SAFETY: the host launches this kernel only with sinks, one block per query head.
    let Some(sink) = (unsafe { p.mods.sink(h) }) else {
        return;
    };
    let acc = sink_gradient(sink, s.batch, s.n_q, |b, i| {
        let bh = (b * s.heads_q + h) as usize;
        // SAFETY: row i of (b, h) is inside LSE and the padded D.
        unsafe {
            (
                *(p.lse as *const f32).add(bh * s.n_q as usize + i as usize),
                *(p.d_sum as *const f32).add(bh * p.n_q_pad as usize + i as usize),
            )
        }
    });
    if thread_x() == 0 {
        // SAFETY: `d_sinks` holds heads_q f32.
        unsafe { *(p.mods.d_sinks as *mut f32).add(h as usize) = acc };
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn flash_tc_backward_d_sink(p: TensorCoreBackwardParams) {
    // SAFETY: the host ran the preprocess and launched one warp per query head.
    unsafe { d_sink(&p) }
}

/// Eight elements per thread: `dQ = τ · accumulator`, rounded to the storage dtype. The
/// accumulator is contiguous; dQ has its strides.
#[inline(always)]
unsafe fn convert_dq<T: MmaElem>(p: &TensorCoreBackwardParams) {
    let s = p.shape;
    // Q can hold more than 2^32 / 8 groups of eight elements.
    let first = (block_x() as usize * block_dim_x() as usize + thread_x() as usize) * 8;
    if first >= s.q_elems() {
        return;
    }
    // Row `(b, i, h)` of the contiguous accumulator and the column `c` the eight elements start
    // at (d is a multiple of 8: they are in one row).
    let (row, c) = (first / s.head_dim as usize, first % s.head_dim as usize);
    let (h, bi) = (row % s.heads_q as usize, row / s.heads_q as usize);
    let (i, b) = (bi % s.n_q as usize, bi / s.n_q as usize);
    let dst = p.strides.dq.offset(b as u32, i as u32, h as u32) + c as u64;
    // SAFETY: q_elems is a multiple of d (hence of 8); the eight elements are inside both tensors.
    unsafe {
        let x = *(p.dq_accum as *const [f32; 8]).add(first / 8);
        let mut words = [0u32; 4];
        for (k, w) in words.iter_mut().enumerate() {
            *w = T::pack(p.scale * x[2 * k], p.scale * x[2 * k + 1]);
        }
        store_global_16(p.dq + dst * 2, words);
    }
}

/// Entry points named as the host formats them: `flash_tc_backward_preprocess_<dtype>_d<d>`,
/// `flash_tc_backward_convert_dq_<dtype>`.
macro_rules! preprocess_entries {
    ($($name:ident => $t:ty, $w:expr;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: TensorCoreBackwardParams) {
            // SAFETY: the host validated the buffers against `p` and launched one warp per row.
            unsafe { preprocess::<$t, $w>(&p) }
        }
    )*};
}

macro_rules! convert_entries {
    ($($name:ident => $t:ty;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: TensorCoreBackwardParams) {
            // SAFETY: the host validated the buffers against `p`.
            unsafe { convert_dq::<$t>(&p) }
        }
    )*};
}

preprocess_entries! {
    flash_tc_backward_preprocess_bf16_d64 => Bf16, 1;
    flash_tc_backward_preprocess_f16_d64 => F16, 1;
    flash_tc_backward_preprocess_bf16_d128 => Bf16, 2;
    flash_tc_backward_preprocess_f16_d128 => F16, 2;
    flash_tc_backward_preprocess_bf16_d192 => Bf16, 3;
    flash_tc_backward_preprocess_f16_d192 => F16, 3;
    flash_tc_backward_preprocess_bf16_d256 => Bf16, 4;
    flash_tc_backward_preprocess_f16_d256 => F16, 4;
}

convert_entries! {
    flash_tc_backward_convert_dq_bf16 => Bf16;
    flash_tc_backward_convert_dq_f16 => F16;
}
