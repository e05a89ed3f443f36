//! The split-KV decode kernel (see `super`). Scores are base 2 (`τ·log2 e` folded into Q).

use crate::abi::params::DecodeParams;
use crate::abi::storage::{Bf16, F16};
use crate::arch::{
    block_x, block_y, block_z, exp2, log2, shared_base, shfl_xor, sync_threads, sync_warp,
    thread_x, warp_sum,
};
use crate::attn::mask::{Exponent, MASKED, allowed_weight, contribution, row_is_empty};
use crate::attn::online_state::Real;
use crate::attn::sequence::Sequence;

use super::{STEP_KEYS, THREADS};

/// Sixteen bytes of K or V: eight 16-bit elements, one vector load.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Chunk([u32; 4]);

/// Eight f32 of the Q tile, two 16-byte shared loads.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Q8([f32; 8]);

/// Most 16-byte chunks of K or V one thread holds at once: a batch of loads is issued before the
/// first is used, so a thread keeps up to 256 bytes in flight (a d = 128 K row while scoring; one
/// chunk of each of its `d/8` keys in `P·V`).
const IN_FLIGHT: usize = 16;

/// Chunks per batch of loads for `R` rows and head dim `D`: all `D/8` while the `R` rows'
/// accumulators leave room (`64 / R` chunks: 256 words of chunks and accumulators together).
const fn in_flight(d: usize, r: usize) -> usize {
    let room = 64 / r;
    if d / 8 < room { d / 8 } else { room }
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

/// Warp maximum that keeps a NaN (a NaN or `+∞` score makes the row NaN).
#[inline(always)]
pub(super) fn warp_max_nan(mut x: f32) -> f32 {
    let mut m = 16;
    while m > 0 {
        x = x.max_nan(shfl_xor(x, m));
        m >>= 1;
    }
    x
}

/// Grid `(splits, heads_kv, sequences)`, block [`THREADS`], shared `super::shared_bytes(R, D)`.
/// Row `r < group · n_q` of the tile is query head `hk · group + r / n_q`, query row `r % n_q`.
#[inline(always)]
unsafe fn decode<T: Exponent, const D: usize, const R: usize>(p: &DecodeParams) {
    const { assert!(D % 8 == 0 && THREADS as usize % (D / 8) == 0 && D / 8 <= IN_FLIGHT) };
    let s = p.shape;
    let (split, hk) = (block_x(), block_y());
    // SAFETY: the host launched one block row per sequence of the layout.
    let seq = unsafe { Sequence::locate(&p.layout, &s, block_z()) };
    let t = thread_x() as usize;
    let (warp, lane) = (t / 32, t % 32);
    let group = s.heads_q / s.heads_kv;
    let rows = (group * seq.q_len) as usize;
    let head = |r: usize| hk * group + r as u32 / seq.q_len;
    let local_row = |r: usize| r as u32 % seq.q_len;

    let q_s = shared_base() as *mut f32;
    // SAFETY: the window holds R·(D + STEP_KEYS + 3) f32 and STEP_KEYS u32
    // (super::shared_bytes).
    let (score, stats) = unsafe {
        let score = q_s.add(R * D);
        (score, score.add(R * STEP_KEYS as usize))
    };
    let (row_max, row_sum, rescale) = unsafe { (stats, stats.add(R), stats.add(2 * R)) };
    // The K/V tensor row of each key of the step, translated once (while scoring) for `P·V`.
    let key_rows = unsafe { stats.add(3 * R) } as *mut u32;
    // Tensor rows fit u32: below 2^31 (host-checked, contiguous and paged).
    let first_row = seq.batch as u64 * s.n_k as u64 + seq.k_start as u64;
    let row_offset = |row: u32| (row as usize * s.heads_kv as usize + hk as usize) * D;

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
    if t < R {
        // SAFETY: inside the statistics.
        unsafe {
            *row_max.add(t) = f32::NEG_INFINITY;
            *row_sum.add(t) = 0.0;
        }
    }
    // Row r sees keys below `key_end[r]` (causal bottom-right per sequence, key lengths); this
    // split owns keys `k0 .. k1`.
    let mut key_end = [0u32; R];
    for (r, e) in key_end.iter_mut().enumerate() {
        *e = if r < rows {
            seq.key_end(local_row(r), p.causal != 0)
        } else {
            0
        };
    }
    let k0 = split * p.keys_per_split;
    let k1 = seq.k_len.min(k0.saturating_add(p.keys_per_split));
    let lanes_per_key = D / 8;
    let (key_group, col) = (t / lanes_per_key, t % lanes_per_key);
    let key_groups = THREADS as usize / lanes_per_key;
    let mut acc = [[0.0f32; 8]; R];
    sync_threads();

    let mut step = k0;
    while step < k1 {
        // Scores: thread t takes key `step + t`, whole rows of K against every row of Q.
        let j = step + t as u32;
        let mut dots = [0.0f32; R];
        if j < k1 {
            // SAFETY: key j < k_len is inside the sequence's rows (host-checked against its
            // pages when paged).
            let row = unsafe { p.pages.row(seq.batch, first_row, j) } as u32;
            // SAFETY: inside the step's rows.
            unsafe { *key_rows.add(t) = row };
            let k_row = row_offset(row);
            let mut words = [[0u32; 4]; IN_FLIGHT];
            let mut c0 = 0;
            while c0 < D / 8 {
                each_chunk!(c < in_flight(D, R) => {
                    // SAFETY: key j < k_len is a key row of the sequence.
                    words[c] = unsafe { load_chunk(p.k, k_row + 8 * (c0 + c)) };
                });
                each_chunk!(c < in_flight(D, R) => {
                    let k = widen8::<T>(words[c]);
                    for (r, dot) in dots.iter_mut().enumerate() {
                        // SAFETY: inside the Q tile, 32-byte aligned (D % 8 == 0).
                        let Q8(q) = unsafe { *(q_s.add(r * D + 8 * (c0 + c)) as *const Q8) };
                        for (&qe, &x) in q.iter().zip(&k) {
                            *dot += qe * x;
                        }
                    }
                });
                c0 += in_flight(D, R);
            }
        }
        for (r, &dot) in dots.iter().enumerate() {
            let allowed = j < k1 && j < key_end[r];
            // SAFETY: inside the score tile.
            unsafe {
                *score.add(r * STEP_KEYS as usize + t) =
                    if allowed { dot } else { f32::NEG_INFINITY }
            };
        }
        sync_threads();
        // Online softmax, one warp per row: the step's maximum, weights, and the rescale of
        // what the row held.
        let mut r = warp;
        while r < R {
            let row = unsafe { score.add(r * STEP_KEYS as usize) };
            let mut m = f32::NEG_INFINITY;
            let mut x = [0.0f32; STEP_KEYS as usize / 32];
            for (e, v) in x.iter_mut().enumerate() {
                // SAFETY: inside the score tile.
                *v = unsafe { *row.add(e * 32 + lane) };
                if *v != f32::NEG_INFINITY {
                    m = m.max_nan(*v);
                }
            }
            // SAFETY: inside the statistics.
            let m_old = unsafe { *row_max.add(r) };
            let m_new = m_old.max_nan(warp_max_nan(m));
            let mut sum = 0.0;
            for (e, &v) in x.iter().enumerate() {
                let w = if v == f32::NEG_INFINITY {
                    MASKED
                } else {
                    allowed_weight(exp2(v - m_new))
                };
                sum += w;
                // SAFETY: inside the score tile.
                unsafe { *row.add(e * 32 + lane) = w };
            }
            let sum = warp_sum(sum);
            // Every lane has read `row_max[r]` before lane 0 rewrites it (racecheck does not
            // count the shuffles as ordering).
            sync_warp();
            if lane == 0 {
                // Nothing allowed yet: nothing to rescale (and `−∞ − −∞` is never evaluated).
                let alpha = if m_new == f32::NEG_INFINITY {
                    1.0
                } else {
                    exp2(m_old - m_new)
                };
                // SAFETY: inside the statistics.
                unsafe {
                    *row_max.add(r) = m_new;
                    *row_sum.add(r) = alpha * *row_sum.add(r) + sum;
                    *rescale.add(r) = alpha;
                }
            }
            r += THREADS as usize / 32;
        }
        sync_threads();
        // O += P·V: `lanes_per_key` lanes read one V row with 16-byte loads; key groups take
        // every `key_groups`-th key of the step.
        for (r, a) in acc.iter_mut().enumerate() {
            // SAFETY: inside the statistics.
            let alpha = unsafe { *rescale.add(r) };
            for x in a.iter_mut() {
                *x *= alpha;
            }
        }
        // This thread's keys of the step: `key_group + g · key_groups`, `g < d/8`.
        let key = |g: usize| key_group + g * key_groups;
        let mut words = [[0u32; 4]; IN_FLIGHT];
        let mut g0 = 0;
        while g0 < D / 8 {
            each_chunk!(g < in_flight(D, R) => {
                let j = step + key(g0 + g) as u32;
                if j < k1 {
                    // SAFETY: key j < k_len is a key row of the sequence, its row translated
                    // while scoring.
                    words[g] = unsafe {
                        let row = *key_rows.add(key(g0 + g));
                        load_chunk(p.v, row_offset(row) + 8 * col)
                    };
                }
            });
            each_chunk!(g < in_flight(D, R) => {
                if step + (key(g0 + g) as u32) < k1 {
                    let v = widen8::<T>(words[g]);
                    for (r, a) in acc.iter_mut().enumerate() {
                        // SAFETY: inside the score tile.
                        let w = unsafe { *score.add(r * STEP_KEYS as usize + key(g0 + g)) };
                        for (x, &y) in a.iter_mut().zip(&v) {
                            *x += contribution(w, y);
                        }
                    }
                }
            });
            g0 += in_flight(D, R);
        }
        sync_threads();
        step += STEP_KEYS;
    }

    // The key groups' sums, added one group at a time into the Q tile's place.
    let o_s = q_s;
    let mut i = t;
    while i < R * D {
        // SAFETY: inside the tile.
        unsafe { *o_s.add(i) = 0.0 };
        i += THREADS as usize;
    }
    sync_threads();
    for g in 0..key_groups {
        if g == key_group {
            for (r, a) in acc.iter().enumerate() {
                for (e, &x) in a.iter().enumerate() {
                    // SAFETY: inside the tile.
                    unsafe { *o_s.add(r * D + 8 * col + e) += x };
                }
            }
        }
        sync_threads();
    }
    // Partial O = u / ℓ (0 for a row with nothing allowed in this split), LSE = (m + log2 ℓ)·ln 2.
    let part = split as usize;
    let o_part = (p.o_part as *mut f32).wrapping_add(part * s.q_elems());
    let lse_part = (p.lse_part as *mut f32).wrapping_add(part * s.row_elems());
    let mut i = t;
    while i < rows * D {
        let (r, c) = (i / D, i % D);
        // SAFETY: inside the statistics and the tile; row r is a row of the sequence.
        unsafe {
            let l = *row_sum.add(r);
            let o = if row_is_empty(l) {
                0.0
            } else {
                *o_s.add(i) / l
            };
            *o_part.add(seq.q_offset(&s, local_row(r), head(r)) + c) = o;
        }
        i += THREADS as usize;
    }
    if t < rows {
        // SAFETY: as above.
        unsafe {
            let l = *row_sum.add(t);
            let lse = if row_is_empty(l) {
                f32::NEG_INFINITY
            } else {
                (*row_max.add(t) + log2(l)) * core::f32::consts::LN_2
            };
            *lse_part.add(seq.row_index(&s, local_row(t), head(t))) = lse;
        }
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
