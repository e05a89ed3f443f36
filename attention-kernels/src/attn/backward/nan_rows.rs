//! Kernel 4 of the tensor-core backward, after the dQ conversion: the gradients of rows whose
//! LSE is NaN (a NaN or `+∞` score at an allowed key). The reference gives such a row NaN
//! gradients at every key of its support and nothing at the keys it scored `−∞` (which a
//! non-finite Q or K can give), and the main kernels cannot tell those apart from the LSE: the
//! preprocess makes the row empty for them (P = 0, D = 0, its non-finite Q elements zeroed), and
//! this pass writes NaN where the reference has it: dK and dV of each key of the row's window
//! whose modified score (softcap, ALiBi) is other than `−∞`, from the real Q and K, and the row's
//! dQ. Rows that are not NaN cost one load.

use crate::abi::layout::{LENGTHS_PACKED, SequenceLayout, TensorStrides};
use crate::abi::params::TensorCoreBackwardParams;
use crate::abi::shape::AttentionShape;
use crate::abi::storage::{Bf16, F16};
use crate::arch::{ballot, block_dim_x, block_x, thread_x, warp_sum};
use crate::attn::backward::Pair;
use crate::attn::score_mod::distance;
use crate::attn::sequence::Sequence;

/// One thread per row `(b, h, i)` of the LSE `[batch, heads_q, n_q]`; the warp takes its NaN
/// rows one at a time.
#[inline(always)]
unsafe fn nan_rows<T: Pair>(p: &TensorCoreBackwardParams) {
    let s = p.shape;
    let lane = thread_x() % 32;
    let row = block_x() * block_dim_x() + thread_x();
    let rows = s.batch * s.heads_q * s.n_q;
    // SAFETY: `row` indexes the forward's LSE.
    let nan = row < rows && unsafe { *(p.lse as *const f32).add(row as usize) }.is_nan();
    let mut pending = ballot(nan);
    while pending != 0 {
        let bit = pending.trailing_zeros();
        pending &= pending - 1;
        // SAFETY: a row of the LSE; the host validated the tensors against `p`.
        unsafe { poison_row::<T>(p, row - lane + bit, lane) };
    }
}

/// NaN into dK, dV of the keys row `row` scores other than `−∞`, and into its dQ.
#[inline(always)]
unsafe fn poison_row<T: Pair>(p: &TensorCoreBackwardParams, row: u32, lane: u32) {
    let s = p.shape;
    let (bh, i) = (row / s.n_q, row % s.n_q);
    let (b, h) = (bh / s.heads_q, bh % s.heads_q);
    // SAFETY: the layout's arrays are the host's, valid for its mode.
    let Some(seq) = (unsafe { sequence_of(&p.layout, &s, b, i) }) else {
        return;
    };
    let local = i - seq.q_start;
    // Words of a Q, K, dQ or dK row, and of a dV row.
    let (words, v_words) = ((s.head_dim / 2) as usize, (s.head_dim_v / 2) as usize);
    // Word offsets (strides are whole 16-byte chunks, so even in elements).
    let st = &p.strides;
    let q_word = |strides: &TensorStrides| (seq.q_row(strides, local, h) / 2) as usize;
    let hk = s.kv_head(h);
    // SAFETY: the slopes, when set, hold heads_q > h values (validated by the host).
    let score_mod = unsafe { p.mods.for_head(h) };
    let (first, end) = seq.key_range(local, p.causal != 0, p.mods.window);
    let q_at = q_word(&st.q);
    let (q, k) = (p.q as *const u32, p.k as *const u32);
    let nan = T::pack(f32::NAN, f32::NAN);
    let poison = |base: u64, at: usize, words: usize| {
        let mut w = lane as usize;
        while w < words {
            // SAFETY: a row of the tensor (the caller's offsets); racing writers store the same NaN.
            unsafe { *(base as *mut u32).add(at + w) = nan };
            w += 32;
        }
    };
    let mut any = false;
    for j in first..end {
        let k_word = |strides: &TensorStrides| (seq.k_row(strides, j, hk) / 2) as usize;
        let k_at = k_word(&st.k);
        let mut dot = 0.0f32;
        let mut w = lane as usize;
        while w < words {
            // SAFETY: rows of Q and K (validated by the host).
            let (x, y) = unsafe { (T::unpack(*q.add(q_at + w)), T::unpack(*k.add(k_at + w))) };
            dot += x[0] * y[0] + x[1] * y[1];
            w += 32;
        }
        // A sum with a `+∞` or NaN term is not `−∞` in any order, so the lanes' order does not
        // change the test (τ > 0 keeps the sign; a softcap maps −∞ to −c, in the support).
        let d = distance(local, j, seq.q_len, seq.k_len);
        if score_mod.apply_log2(warp_sum(dot), p.scale_log2, d) != f32::NEG_INFINITY {
            any = true;
            poison(p.dk, k_word(&st.dk), words);
            poison(p.dv, k_word(&st.dv), v_words);
        }
    }
    if any {
        poison(p.dq, q_word(&st.dq), words);
    }
}

/// The sequence holding tensor row `i` of batch item `b`, if any (rows past the last packed
/// sequence belong to none).
///
/// # Safety
/// The layout's arrays are valid device arrays of its mode.
#[inline(always)]
unsafe fn sequence_of(
    layout: &SequenceLayout,
    shape: &AttentionShape,
    b: u32,
    i: u32,
) -> Option<Sequence> {
    if layout.mode != LENGTHS_PACKED {
        // SAFETY: b < batch = sequences (caller).
        return Some(unsafe { Sequence::locate(layout, shape, b) });
    }
    let cu = layout.cu_seqlens_q as *const u32;
    (0..layout.sequences)
        // SAFETY: `cu_seqlens_q` holds `sequences + 1` offsets from 0, non-decreasing.
        .find(|&s| i < unsafe { *cu.add(s as usize + 1) })
        .map(|s| unsafe { Sequence::locate(layout, shape, s) })
}

/// Entry points named as the host formats them: `flash_tc_backward_nan_rows_<dtype>`.
macro_rules! nan_rows_entries {
    ($($name:ident => $t:ty;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: TensorCoreBackwardParams) {
            // SAFETY: the host validated the buffers against `p`.
            unsafe { nan_rows::<$t>(&p) }
        }
    )*};
}

nan_rows_entries! {
    flash_tc_backward_nan_rows_bf16 => Bf16;
    flash_tc_backward_nan_rows_f16 => F16;
}
