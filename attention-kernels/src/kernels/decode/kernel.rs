//! The split-KV decode kernel (see `super`). Scores are base 2 (`τ·log2 e` folded into Q).
//!
//! Each warp streams its own keys with no block barrier in the loop: `D/8` lanes hold one K or V
//! row as 16-byte chunks (`32·8/D` rows per load instruction, each a run of `2·D` contiguous
//! bytes), a lane group keeps its own online state `(m, ℓ, O)` over its keys, and the groups'
//! states are merged once at the end (shuffles within the warp, shared memory across warps).
//! K of the next iteration is loaded while this one's softmax and `P·V` run, and V while its
//! scores run, so a lane keeps `U` to `2U` chunks in flight (`super::unroll`).

use crate::abi::params::DecodeParams;
use crate::abi::storage::{Bf16, F16};
use crate::arch::{
    block_x, block_y, block_z, exp2, log2, shared_base, shfl_xor, sync_threads, thread_x,
};
use crate::attn::mask::{Exponent, MASKED, allowed_weight, contribution, row_is_empty};
use crate::attn::online_state::Real;
use crate::attn::sequence::Sequence;

use super::{THREADS, WARPS, unroll};

/// 16-bit elements per 16-byte chunk.
const CHUNK: usize = 8;
/// Most keys a lane group takes per iteration (the largest [`unroll`]).
const MAX_UNROLL: usize = 8;

/// Sixteen bytes of K or V: eight 16-bit elements, one vector load.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Chunk([u32; 4]);

/// Eight f32 of the Q tile, two 16-byte shared loads.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Q8([f32; 8]);

/// `body` for `u = 0, 1, …` below `n` (at most [`MAX_UNROLL`]), each with a constant `u`: the
/// chunk and score arrays are indexed only by constants and stay in registers (LLVM leaves loops
/// with bodies this large rolled, which would move the arrays to local memory).
macro_rules! each_key {
    ($u:ident < $n:expr => $body:block) => {
        unrolled!($u, $n, $body, 0 1 2 3 4 5 6 7)
    };
}

/// As [`each_key`] for the rows `r` below `n` (at most 16) of the state arrays.
macro_rules! each_row {
    ($r:ident < $n:expr => $body:block) => {
        unrolled!($r, $n, $body, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
}

macro_rules! unrolled {
    ($i:ident, $n:expr, $body:block, $($k:literal)*) => {$(
        if $k < $n {
            let $i: usize = $k;
            $body
        }
    )*};
}

/// The eight 16-bit elements at element offset `at` (a multiple of 8).
///
/// # Safety
/// The elements are inside the tensor at `base`; rows are 16-byte aligned (`d % 8 == 0`).
#[inline(always)]
unsafe fn load_chunk(base: u64, at: usize) -> [u32; 4] {
    // SAFETY: the caller's contract.
    unsafe { (*((base as *const u16).add(at) as *const Chunk)).0 }
}

/// The eight Q elements at `at` of the tile. Up to four rows LLVM keeps them in registers across
/// the key loop; from eight rows on the volatile read keeps them in shared memory (re-read per
/// key, broadcast to the lane groups), leaving the registers to the accumulators.
#[inline(always)]
fn q_fragment(q_s: *const f32, at: usize, rows: usize) -> Q8 {
    let p = q_s.wrapping_add(at) as *const Q8;
    // SAFETY: `at` is inside the Q tile, 32-byte aligned (D % 8 == 0).
    unsafe {
        if rows >= 8 {
            core::ptr::read_volatile(p)
        } else {
            *p
        }
    }
}

/// Eight elements widened to f32.
#[inline(always)]
fn widen8<T: Exponent>(w: [u32; 4]) -> [f32; 8] {
    let mut out = [0.0; 8];
    for (k, &word) in w.iter().enumerate() {
        let [lo, hi] = T::widen_pair(word);
        out[2 * k] = lo;
        out[2 * k + 1] = hi;
    }
    out
}

/// The factor `2^(m_part − m)` of a state with maximum `m_part` in a merge whose maximum is `m`:
/// 0 for an empty state (`−∞`, never `−∞ − −∞`), NaN when `m` is.
#[inline(always)]
fn state_weight(m_part: f32, m: f32) -> f32 {
    if m_part == f32::NEG_INFINITY {
        0.0
    } else {
        exp2(m_part - m)
    }
}

/// Grid `(splits, heads_kv, sequences)`, block [`THREADS`], shared `super::shared_bytes(R, D)`.
/// Row `r < group · n_q` of the tile is query head `hk · group + r / n_q`, query row `r % n_q`.
#[inline(always)]
unsafe fn decode<T: Exponent, const D: usize, const R: usize>(p: &DecodeParams) {
    const { assert!(D % CHUNK == 0 && 32 % (D / CHUNK) == 0 && unroll(R) <= MAX_UNROLL) };
    let s = p.shape;
    let (split, hk) = (block_x(), block_y());
    // SAFETY: the host launched one block row per sequence of the layout.
    let seq = unsafe { Sequence::locate(&p.layout, &s, block_z()) };
    let t = thread_x() as usize;
    let (warp, lane) = (t / 32, t % 32);
    // `lanes` lanes hold one key row; a warp load covers `subs` consecutive keys.
    let lanes = D / CHUNK;
    let subs = 32 / lanes;
    let (sub, col) = (lane / lanes, lane % lanes);
    let keys_per_warp = subs * unroll(R);
    let group = s.heads_q / s.heads_kv;
    let rows = (group * seq.q_len) as usize;
    let head = |r: usize| hk * group + r as u32 / seq.q_len;
    let local_row = |r: usize| r as u32 % seq.q_len;
    let causal = p.causal != 0;
    // Keys `start .. end` of row r (causal, key length, window); padding rows see none.
    let range = |r: usize| {
        if r < rows {
            seq.key_range(local_row(r), causal, p.window)
        } else {
            (0, 0)
        }
    };

    let q_s = shared_base() as *mut f32;
    let mut i = t;
    while i < R * D {
        let (r, c) = (i / D, i % D);
        let x = if r < rows {
            let off = seq.q_offset(&s, local_row(r), head(r)) + c;
            // SAFETY: row r is a query row of the sequence.
            T::widen(unsafe { *(p.q as *const u16).add(off) } as u32) * p.scale_log2
        } else {
            0.0
        };
        // SAFETY: inside the Q tile.
        unsafe { *q_s.add(i) = x };
        i += THREADS as usize;
    }
    // This split owns keys `k0 .. k1`; some row sees keys in `kb .. ke`, every row those in
    // `lo .. hi` (where no key needs a per-row test).
    let k0 = split * p.keys_per_split;
    let k1 = seq.k_len.min(k0.saturating_add(p.keys_per_split));
    let (mut kb, mut ke, mut lo, mut hi) = (u32::MAX, 0, 0, u32::MAX);
    for r in 0..rows.min(R) {
        let (a, b) = range(r);
        (kb, ke, lo, hi) = (kb.min(a), ke.max(b), lo.max(a), hi.min(b));
    }
    let (kb, ke) = (kb.max(k0), ke.min(k1));
    sync_threads();

    let key = |base: u32, u: usize| base + (u * subs + sub) as u32;
    let chunk_at = |j: u32| seq.k_offset(&s, j, hk) + CHUNK * col;
    let load = |buf: &mut [[u32; 4]; MAX_UNROLL], src: u64, base: u32| {
        each_key!(u < unroll(R) => {
            let j = key(base, u);
            buf[u] = if j < ke {
                // SAFETY: key j < k_len is a key row of the sequence.
                unsafe { load_chunk(src, chunk_at(j)) }
            } else {
                [0; 4]
            };
        });
    };
    let mut m = [f32::NEG_INFINITY; R];
    let mut l = [0.0f32; R];
    let mut acc = [[0.0f32; CHUNK]; R];
    let stride = (WARPS as usize * keys_per_warp) as u32;
    let mut base = kb.saturating_add((warp * keys_per_warp) as u32);
    let (mut k_buf, mut v_buf) = ([[0u32; 4]; MAX_UNROLL], [[0u32; 4]; MAX_UNROLL]);
    load(&mut k_buf, p.k, base);
    while base < ke {
        load(&mut v_buf, p.v, base);
        let full = base >= lo && base.saturating_add(keys_per_warp as u32) <= hi;
        // Scores of this lane group's keys: partial dots over the lane's 8 columns, summed over
        // the `lanes` lanes of the row (masked: −∞).
        let mut score = [[0.0f32; R]; MAX_UNROLL];
        each_key!(u < unroll(R) => {
            let k = widen8::<T>(k_buf[u]);
            let j = key(base, u);
            each_row!(r < R => {
                let Q8(q) = q_fragment(q_s, r * D + CHUNK * col, R);
                let mut dot = 0.0f32;
                for (&qe, &x) in q.iter().zip(&k) {
                    dot += qe * x;
                }
                let mut off = 1;
                while off < lanes {
                    dot += shfl_xor(dot, off as u32);
                    off <<= 1;
                }
                let allowed = j < ke && (full || {
                    let (a, b) = range(r);
                    a <= j && j < b
                });
                score[u][r] = if allowed { dot } else { f32::NEG_INFINITY };
            });
        });
        let next = base.saturating_add(stride);
        if next < ke {
            load(&mut k_buf, p.k, next);
        }
        // Online softmax of the group's keys, row by row.
        each_row!(r < R => {
            let mut mx = f32::NEG_INFINITY;
            each_key!(u < unroll(R) => {
                if score[u][r] != f32::NEG_INFINITY {
                    mx = mx.max_nan(score[u][r]);
                }
            });
            let m_new = m[r].max_nan(mx);
            // Nothing allowed yet: nothing to rescale (and `−∞ − −∞` is never evaluated).
            let alpha = if m_new == f32::NEG_INFINITY {
                1.0
            } else {
                exp2(m[r] - m_new)
            };
            let mut sum = 0.0;
            each_key!(u < unroll(R) => {
                let w = if score[u][r] == f32::NEG_INFINITY {
                    MASKED
                } else {
                    allowed_weight(exp2(score[u][r] - m_new))
                };
                score[u][r] = w;
                sum += w;
            });
            m[r] = m_new;
            l[r] = alpha * l[r] + sum;
            for x in acc[r].iter_mut() {
                *x *= alpha;
            }
        });
        // Where every key of the iteration is allowed for every row, the keys past `ke` are the
        // only masked ones and their V is zero-filled: plain products. Elsewhere a masked key's
        // V (a causal or window edge, maybe non-finite) must not be read.
        // (Two copies of the loop: one branch per iteration, not a select per product; from
        // eight rows on the registers hold only one copy without spilling more.)
        if full && R <= 4 {
            each_key!(u < unroll(R) => {
                let v = widen8::<T>(v_buf[u]);
                each_row!(r < R => {
                    for (x, &y) in acc[r].iter_mut().zip(&v) {
                        *x += score[u][r] * y;
                    }
                });
            });
        } else {
            each_key!(u < unroll(R) => {
                let v = widen8::<T>(v_buf[u]);
                each_row!(r < R => {
                    for (x, &y) in acc[r].iter_mut().zip(&v) {
                        *x += contribution(score[u][r], y);
                    }
                });
            });
        }
        base = next;
    }

    // The warp's lane groups (same columns, other keys) merged by shuffles.
    let mut off = lanes;
    while off < 32 {
        each_row!(r < R => {
            let m_o = shfl_xor(m[r], off as u32);
            let l_o = shfl_xor(l[r], off as u32);
            let m_new = m[r].max_nan(m_o);
            let (wa, wb) = (state_weight(m[r], m_new), state_weight(m_o, m_new));
            for x in acc[r].iter_mut() {
                let x_o = shfl_xor(*x, off as u32);
                *x = wa * *x + wb * x_o;
            }
            (m[r], l[r]) = (m_new, wa * l[r] + wb * l_o);
        });
        off <<= 1;
    }
    // The warps' states into shared memory (after the Q tile), then merged per output element.
    // SAFETY: the window holds `shared_floats(R, D)` f32.
    let states = unsafe { q_s.add(R * D) };
    let state = |w: usize| unsafe { states.add(w * R * (D + 2)) };
    if sub == 0 {
        let st = state(warp);
        each_row!(r < R => {
            for (e, &x) in acc[r].iter().enumerate() {
                // SAFETY: inside this warp's state.
                unsafe { *st.add(r * D + CHUNK * col + e) = x };
            }
            if col == 0 {
                // SAFETY: as above.
                unsafe {
                    *st.add(R * D + r) = m[r];
                    *st.add(R * D + R + r) = l[r];
                }
            }
        });
    }
    sync_threads();
    // Row r's merged maximum and sum over the warps.
    let merged = |r: usize| {
        let mut m_all = f32::NEG_INFINITY;
        for w in 0..WARPS as usize {
            // SAFETY: inside warp w's state.
            m_all = m_all.max_nan(unsafe { *state(w).add(R * D + r) });
        }
        let mut l_all = 0.0;
        for w in 0..WARPS as usize {
            // SAFETY: as above.
            let (m_w, l_w) = unsafe { (*state(w).add(R * D + r), *state(w).add(R * D + R + r)) };
            l_all += state_weight(m_w, m_all) * l_w;
        }
        (m_all, l_all)
    };
    // Partial O = u / ℓ (0 for a row with nothing allowed in this split), LSE = (m + log2 ℓ)·ln 2.
    let part = split as usize;
    let o_part = (p.o_part as *mut f32).wrapping_add(part * s.q_elems());
    let lse_part = (p.lse_part as *mut f32).wrapping_add(part * s.row_elems());
    let mut i = t;
    while i < rows * D {
        let (r, c) = (i / D, i % D);
        let (m_all, l_all) = merged(r);
        let mut o = 0.0;
        for w in 0..WARPS as usize {
            // SAFETY: inside warp w's state.
            let (m_w, x) = unsafe { (*state(w).add(R * D + r), *state(w).add(r * D + c)) };
            o += state_weight(m_w, m_all) * x;
        }
        let o = if row_is_empty(l_all) { 0.0 } else { o / l_all };
        // SAFETY: row r is a row of the sequence.
        unsafe { *o_part.add(seq.q_offset(&s, local_row(r), head(r)) + c) = o };
        i += THREADS as usize;
    }
    if t < rows {
        let (m_all, l_all) = merged(t);
        let lse = if row_is_empty(l_all) {
            f32::NEG_INFINITY
        } else {
            (m_all + log2(l_all)) * core::f32::consts::LN_2
        };
        // SAFETY: as above.
        unsafe { *lse_part.add(seq.row_index(&s, local_row(t), head(t))) = lse };
    }
}

macro_rules! decode_entries {
    ($($name:ident => $t:ty, $d:literal, $r:literal;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: DecodeParams) {
            // SAFETY: the host validated the tensors and the workspace against `p`.
            unsafe { decode::<$t, $d, $r>(&p) }
        }
    )*};
}

// Named as `attention_host::instances::decode` formats them.
decode_entries! {
    flash_decode_bf16_d64_r1 => Bf16, 64, 1;
    flash_decode_bf16_d64_r2 => Bf16, 64, 2;
    flash_decode_bf16_d64_r4 => Bf16, 64, 4;
    flash_decode_bf16_d64_r8 => Bf16, 64, 8;
    flash_decode_bf16_d64_r16 => Bf16, 64, 16;
    flash_decode_bf16_d128_r1 => Bf16, 128, 1;
    flash_decode_bf16_d128_r2 => Bf16, 128, 2;
    flash_decode_bf16_d128_r4 => Bf16, 128, 4;
    flash_decode_bf16_d128_r8 => Bf16, 128, 8;
    flash_decode_bf16_d128_r16 => Bf16, 128, 16;
    flash_decode_f16_d64_r1 => F16, 64, 1;
    flash_decode_f16_d64_r2 => F16, 64, 2;
    flash_decode_f16_d64_r4 => F16, 64, 4;
    flash_decode_f16_d64_r8 => F16, 64, 8;
    flash_decode_f16_d64_r16 => F16, 64, 16;
    flash_decode_f16_d128_r1 => F16, 128, 1;
    flash_decode_f16_d128_r2 => F16, 128, 2;
    flash_decode_f16_d128_r4 => F16, 128, 4;
    flash_decode_f16_d128_r8 => F16, 128, 8;
    flash_decode_f16_d128_r16 => F16, 128, 16;
}
