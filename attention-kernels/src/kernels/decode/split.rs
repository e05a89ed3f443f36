//! The split-KV decode kernel on `mma.sync` (see `super`).
//! Scores are base 2 (`τ·log2 e` applied to S).

use crate::abi::layout::KeyPages;
use crate::abi::params::DecodeParams;
use crate::abi::storage::{Bf16, F16};
use crate::arch::{
    ballot, block_x, block_y, block_z, exp2, grid_dim_x, log2, shared_base, shared_window,
    sync_threads, sync_threads_or, thread_x,
};
use crate::attn::mask::{
    Exponent, OperandRows, non_finite_part, row_is_empty, sanitize_own_chunks,
};
use crate::attn::sequence::Sequence;
use crate::attn::softmax::{RowState, rescale};
use crate::tile::SwizzledTile;
use crate::tile::cp_async::{commit, copy16, wait_all, wait_groups};
use crate::tile::mem_backward::load_shared_u32;
use crate::tile::mma::{FragA, FragC, MmaElem};

use super::last_split::{Partials, arrive_last, merge_splits, store4};
use super::{BLOCK_KEYS, MAX_ROWS, MAX_SPLITS, STAGES, THREADS, merge_stride};

const WARPS: u32 = THREADS / 32;
/// Keys of a tile per warp: two n-tiles of `S`, one k-step of `P·V`.
const WARP_KEYS: u32 = BLOCK_KEYS / WARPS;

/// Two f32, one 8-byte shared store.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct Cols2([f32; 2]);

/// Four f32, one 16-byte load or store.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Cols4([f32; 4]);

/// One K/V head's rows of a sequence in K or V, contiguous or paged.
#[derive(Clone, Copy)]
struct KeyRows {
    base: u64,
    pages: KeyPages,
    batch: u32,
    /// The sequence's first tensor row in a contiguous layout.
    first_row: u64,
    heads_kv: u32,
    head: u32,
    head_dim: u32,
}

impl KeyRows {
    /// Byte offset of tensor row `row`'s K/V head from the tensor's start.
    #[inline(always)]
    fn offset(&self, row: u64) -> u64 {
        row * self.row_bytes() + 2 * (self.head * self.head_dim) as u64
    }

    /// Bytes from one tensor row to the next.
    #[inline(always)]
    fn row_bytes(&self) -> u64 {
        2 * self.heads_kv as u64 * self.head_dim as u64
    }

    /// Byte offset of the sequence's key `j` in the contiguous layout.
    #[inline(always)]
    fn contiguous_offset(&self, j: u32) -> u64 {
        self.offset(self.first_row + j as u64)
    }

    /// The tensor row of the sequence's key `j`.
    ///
    /// # Safety
    /// `j` is below the sequence's key length.
    #[inline(always)]
    unsafe fn tensor_row(&self, j: u32) -> u32 {
        // SAFETY: the caller's contract; the host checked every sequence's rows against its
        // pages when paged.
        unsafe { self.pages.row(self.batch, self.first_row, j) as u32 }
    }
}

impl OperandRows for KeyRows {
    #[inline(always)]
    unsafe fn row_addr(&self, key: u32) -> u64 {
        // SAFETY: forwarded to the caller.
        self.base + self.offset(unsafe { self.tensor_row(key) } as u64)
    }
    #[inline(always)]
    fn tiles(&self) -> u32 {
        self.head_dim / 8
    }
}

/// Grid `(splits, heads_kv, sequences)`, block [`THREADS`], shared `super::shared_bytes(d)`, `d =
/// 16·KD`, `ND = 2·KD` n-tiles of O. Row `r < group · n_q` of the 16-row tile is query head
/// `hk · group + r / n_q`, query row `r % n_q`; the host keeps `group · n_q ≤ MAX_ROWS`.
#[inline(always)]
unsafe fn decode<T: MmaElem + Exponent, const KD: usize, const ND: usize>(p: &DecodeParams) {
    // Two slots of key rows serve three stages (see the prologue).
    const {
        assert!(ND == 2 * KD && (KD == 4 || KD == 8) && STAGES == 3);
        // Whole rounds of the block's threads over the Q and K/V chunks.
        assert!((MAX_ROWS * 2 * KD as u32) % THREADS == 0);
        // The last split's merge weights fit the stage region.
        assert!(MAX_ROWS * MAX_SPLITS * 4 <= STAGES * 2 * BLOCK_KEYS * 16 * KD as u32 * 2);
    };
    let d = 16 * KD as u32;
    let chunks = d / 8;
    let s = p.shape;
    let (split, hk) = (block_x(), block_y());
    // SAFETY: the host launched one block row per sequence of the layout.
    let seq = unsafe { Sequence::locate(&p.layout, &s, block_z()) };
    let (tid, warp, lane) = (thread_x(), thread_x() / 32, thread_x() % 32);
    let (g, t) = (lane / 4, lane % 4);
    let group = s.heads_q / s.heads_kv;
    let rows = group * seq.q_len;
    let head = |r: u32| hk * group + r / seq.q_len;
    let local_row = |r: u32| r % seq.q_len;
    let causal = p.causal != 0;
    // This split owns keys `k0 .. k1`; row r sees those below `end(r)` (causal bottom-right per
    // sequence, key lengths), padding rows none.
    let k0 = split * p.keys_per_split;
    let k1 = seq.k_len.min(k0.saturating_add(p.keys_per_split));
    let tiles = if k1 > k0 {
        (k1 - k0).div_ceil(BLOCK_KEYS)
    } else {
        0
    };
    let end = |r: u32| {
        if r < rows {
            seq.key_end(local_row(r), causal).min(k1)
        } else {
            0
        }
    };
    let ends = [end(g), end(g + 8)];
    // Keys from `lo` on are hidden from some rows (the causal diagonal of an `N_q > 1` step):
    // a non-finite V there must not reach them through `0 · NaN` in `P·V`.
    let lo = end(0);

    let smem = shared_window();
    let kv_bytes = BLOCK_KEYS * d * 2;
    let k_tile = |stage: u32| SwizzledTile::new(smem + stage * 2 * kv_bytes, d);
    let v_tile = |stage: u32| SwizzledTile::new(smem + stage * 2 * kv_bytes + kv_bytes, d);
    // Q lives in the last stage's K tile, which tile 2 first fills after every warp has taken
    // its Q fragments (the first loop barrier).
    let q_tile = k_tile(STAGES - 1);
    let merge_bytes = WARPS * MAX_ROWS * merge_stride(d) * 4;
    let rows_offset = (STAGES * 2 * kv_bytes).max(merge_bytes) as usize;
    // SAFETY (both): inside the window (`super::shared_bytes`): two tiles' key rows, then each
    // warp's m and ℓ per row.
    let key_rows = unsafe { shared_base().add(rows_offset) } as *mut u32;
    let stats = unsafe { key_rows.add(2 * BLOCK_KEYS as usize) } as *mut f32;

    let kv = |base| KeyRows {
        base,
        pages: p.pages,
        batch: seq.batch,
        first_row: seq.batch as u64 * s.n_k as u64 + seq.k_start as u64,
        heads_kv: s.heads_kv,
        head: hk,
        head_dim: d,
    };
    let (k_rows, v_rows) = (kv(p.k), kv(p.v));
    // Paged: thread `tid < BLOCK_KEYS` translates key `tid` of a tile (0 past the split) a tile
    // before its copies are issued, so that a block-table lookup never delays them. Contiguous
    // rows need no translation.
    let contiguous = p.pages.is_contiguous();
    let tile_row = |tile: u32| {
        let j = k0 + tile * BLOCK_KEYS + tid;
        if !contiguous && tid < BLOCK_KEYS && j < k1 {
            // SAFETY: j < k1 ≤ k_len.
            unsafe { k_rows.tensor_row(j) }
        } else {
            0
        }
    };
    let set_rows = |tile: u32, row: u32| {
        if !contiguous && tid < BLOCK_KEYS {
            // SAFETY: inside the two tiles' key rows.
            unsafe { *key_rows.add(((tile & 1) * BLOCK_KEYS + tid) as usize) = row };
        }
    };
    let key_rows_at = shared_window() + rows_offset as u32;
    // Thread `tid` copies chunk `c` of rows `r0, r0 + row_step, …` of every tile: chunks are
    // assigned as `ChunkedTile::fill_async` assigns them (`sanitize_own_chunks` relies on it),
    // consecutive threads on consecutive chunks. The swizzle repeats every 8 rows, so the
    // thread's shared addresses are a fixed step apart, as are its contiguous rows'.
    let row_step = const {
        let step = THREADS / (2 * KD as u32);
        assert!(step.is_multiple_of(8) && BLOCK_KEYS.is_multiple_of(step));
        step
    };
    let (r0, c) = (tid / chunks, tid % chunks);
    let shared_step = row_step * chunks * 16;
    let global_step = row_step as u64 * k_rows.row_bytes();
    // K and V of tile `tile` into `stage`: contiguous rows from their addresses, paged ones
    // from the rows `set_rows` put in the tile's slot; keys past the split load as zeros. Loops
    // of constant trip count, so that they unroll.
    let fill = |tile: u32, stage: u32| {
        let first = k0 + tile * BLOCK_KEYS + r0;
        // Rows of the thread's past the split's end are not copied.
        let room = k1.saturating_sub(first);
        let (kd, vd) = (
            k_tile(stage).chunk_addr(r0, c),
            v_tile(stage).chunk_addr(r0, c),
        );
        // SAFETY (all loops): each stage holds BLOCK_KEYS rows; a key below k1 is a row of K
        // and V.
        let copy = |n: u32, k: u64, v: u64, valid: bool| unsafe {
            let (k, v) = if valid {
                (k, v)
            } else {
                (k_rows.base, v_rows.base)
            };
            copy16(kd + n * shared_step, k, valid);
            copy16(vd + n * shared_step, v, valid);
        };
        if contiguous {
            // The thread's rows below `limit` (a constant for whole tiles, so that their copies
            // are unconditional).
            let rows_below = |limit: u32| {
                let at = k_rows.contiguous_offset(first) + 16 * c as u64;
                let (mut k, mut v) = (k_rows.base + at, v_rows.base + at);
                for n in 0..BLOCK_KEYS / row_step {
                    copy(n, k, v, n * row_step < limit);
                    k += global_step;
                    v += global_step;
                }
            };
            if k0 + (tile + 1) * BLOCK_KEYS <= k1 {
                rows_below(BLOCK_KEYS);
            } else {
                rows_below(room);
            }
        } else {
            let slot = key_rows_at + 4 * ((tile & 1) * BLOCK_KEYS + r0);
            for n in 0..BLOCK_KEYS / row_step {
                // SAFETY: inside the slot of `tile`'s rows.
                let row = unsafe { load_shared_u32(slot + 4 * n * row_step) };
                let at = k_rows.offset(row as u64) + 16 * c as u64;
                copy(n, k_rows.base + at, v_rows.base + at, n * row_step < room);
            }
        }
    };

    // Q into the 16-row tile (zero rows past the group's), with tiles 0 and 1 in flight.
    for n in 0..MAX_ROWS * chunks / THREADS {
        let i = tid + n * THREADS;
        let (r, c) = (i / chunks, i % chunks);
        let valid = r < rows;
        let at = if valid {
            2 * seq.q_offset(&s, local_row(r), head(r)) as u64 + 16 * c as u64
        } else {
            0
        };
        // SAFETY: row r < rows is a query row of the sequence; the tile holds 16 rows.
        unsafe { copy16(q_tile.chunk_addr(r, c), p.q + at, valid) };
    }
    set_rows(0, tile_row(0));
    set_rows(1, tile_row(1));
    sync_threads();
    for tile in 0..STAGES - 1 {
        if tile < tiles {
            fill(tile, tile);
        }
        commit();
    }
    let next = tile_row(STAGES - 1);
    // Every thread has read tile 0's rows before tile 2's replace them.
    sync_threads();
    set_rows(STAGES - 1, next);
    wait_groups::<{ STAGES - 2 }>();
    sync_threads();
    let mut q_frag = [FragA::default(); KD];
    for (kk, f) in q_frag.iter_mut().enumerate() {
        // SAFETY: the 16 rows are the Q tile's.
        *f = unsafe { q_tile.load_a(0, kk as u32, lane) };
    }

    let mut o = [FragC::default(); ND];
    let mut state = RowState::new();
    let mut poisoned = false;
    let mut stage = 0;
    let key0 = WARP_KEYS * warp;
    let mut tile = 0;
    while tile < tiles {
        // Tile `tile` has landed (the newer ones may still load), and every warp is done with
        // the stage the next fill overwrites. A diagonal tile's V is sanitized as it lands
        // (each thread its own chunks, before the barrier that publishes them; the barrier
        // votes whether any was non-finite), and the allowed keys' non-finite part is added
        // after the loop.
        wait_groups::<{ STAGES - 2 }>();
        let first = k0 + tile * BLOCK_KEYS;
        let diagonal = lo < k1 && first + BLOCK_KEYS > lo;
        // SAFETY: the thread's own copies of the stage's V have landed.
        let bad = diagonal
            && unsafe { sanitize_own_chunks::<T, _>(&v_tile(stage), BLOCK_KEYS, tid, THREADS) };
        poisoned |= sync_threads_or(bad);
        if tile + STAGES - 1 < tiles {
            let ahead = if stage == 0 { STAGES - 1 } else { stage - 1 };
            fill(tile + STAGES - 1, ahead);
        }
        commit();
        let next = tile_row(tile + STAGES);

        // S = Q·Kᵀ over the warp's 16 keys, scaled and masked.
        let (kt, vt) = (k_tile(stage), v_tile(stage));
        let mut sc = [FragC::default(); 2];
        for (kk, qf) in q_frag.iter().enumerate() {
            // SAFETY: keys key0 .. key0 + 16 are inside the K tile.
            let [b0, b1] = unsafe { kt.load_b_pair(key0, kk as u32, lane) };
            T::mma(&mut sc[0], qf, &b0);
            T::mma(&mut sc[1], qf, &b1);
        }
        let own = first + key0 + 2 * t;
        for (n, f) in sc.iter_mut().enumerate() {
            for (e, x) in f.0.iter_mut().enumerate() {
                let key = own + 8 * n as u32 + (e as u32 & 1);
                *x = if key < ends[e / 2] {
                    *x * p.scale_log2
                } else {
                    f32::NEG_INFINITY
                };
            }
        }
        let alpha = state.fold(&mut sc, 1.0);
        // Skipped while no row of the group's has a new maximum (α exactly 1): most tiles
        // once the maxima settle. Padding rows' accumulators are never read.
        let moved = (alpha[0] != 1.0 && g < rows) || (alpha[1] != 1.0 && g + 8 < rows);
        if ballot(moved) != 0 {
            rescale(&mut o, alpha);
        }
        let pa = T::pack_a(&sc[0], &sc[1]);
        for dp in 0..KD {
            // SAFETY: keys key0 .. key0 + 16 and chunks 2 dp, 2 dp + 1 are inside the V tile.
            let [b0, b1] = unsafe { vt.load_b_pair_trans(key0, 2 * dp as u32, lane) };
            T::mma(&mut o[2 * dp], &pa, &b0);
            T::mma(&mut o[2 * dp + 1], &pa, &b1);
        }

        set_rows(tile + STAGES, next);
        stage = if stage + 1 == STAGES { 0 } else { stage + 1 };
        tile += 1;
    }

    // The warps' states merged: each warp's O and ℓ rescaled to the rows' common maximum, the
    // accumulators staged in the stages' place (f32, rows `merge_stride` apart), summed.
    wait_all();
    sync_threads();
    let (m, l) = state.stats();
    // SAFETY: the statistics hold WARPS · 16 m, then as many ℓ.
    let (m_s, l_s) = (stats, unsafe { stats.add((WARPS * MAX_ROWS) as usize) });
    let at = |w: u32, r: u32| (w * MAX_ROWS + r) as usize;
    if t == 0 {
        // SAFETY: inside the statistics.
        unsafe {
            *m_s.add(at(warp, g)) = m[0];
            *m_s.add(at(warp, g + 8)) = m[1];
        }
    }
    sync_threads();
    // The row maximum over the warps; a row with nothing allowed keeps −∞ (and subtracts 0).
    let row_max = |r: u32| {
        let mut x = f32::NEG_INFINITY;
        for w in 0..WARPS {
            // SAFETY: inside the statistics.
            x = x.max(unsafe { *m_s.add(at(w, r)) });
        }
        x
    };
    let mut factor = [0.0f32; 2];
    for (k, f) in factor.iter_mut().enumerate() {
        let top = row_max(g + 8 * k as u32);
        *f = exp2(m[k] - if top == f32::NEG_INFINITY { 0.0 } else { top });
    }
    rescale(&mut o, factor);
    if poisoned && warp == 0 {
        // Every key from the first diagonal tile on: keys of other tiles whose non-finite
        // values the product already took change nothing when added again. A key a row
        // allows counts whatever its score (the weight is positive or `0 · NaN`).
        let from = k0 + lo.saturating_sub(k0) / BLOCK_KEYS * BLOCK_KEYS;
        // SAFETY: every key below k1 is a row of V.
        let poison = unsafe {
            non_finite_part::<T, ND>(
                (from, k1),
                [0, 0],
                ends,
                v_rows,
                lane,
                |_, _| false,
                |_, _| true,
            )
        };
        poison.apply(&mut o);
    }
    let stride = merge_stride(d) as usize;
    // The stage region holds WARPS · 16 rows of `stride` f32 (super::shared_bytes).
    let o_s = shared_base() as *mut f32;
    // SAFETY: inside the stage region.
    let mine = unsafe { o_s.add(at(warp, 0) * stride) };
    for (n, f) in o.iter().enumerate() {
        let col = 8 * n + 2 * t as usize;
        // SAFETY: rows g, g + 8 of the warp's rows, 8-byte aligned (even column and stride).
        unsafe {
            *(mine.add(g as usize * stride + col) as *mut Cols2) = Cols2([f.0[0], f.0[1]]);
            *(mine.add((g as usize + 8) * stride + col) as *mut Cols2) = Cols2([f.0[2], f.0[3]]);
        }
    }
    if t == 0 {
        // SAFETY: inside the statistics.
        unsafe {
            *l_s.add(at(warp, g)) = l[0] * factor[0];
            *l_s.add(at(warp, g + 8)) = l[1] * factor[1];
        }
    }
    sync_threads();
    let row_sum = |r: u32| {
        let mut x = 0.0;
        for w in 0..WARPS {
            // SAFETY: inside the statistics.
            x += unsafe { *l_s.add(at(w, r)) };
        }
        x
    };

    // Partial O = u / ℓ (0 for a row with nothing allowed in this split), LSE = (m + log2 ℓ)·ln 2;
    // a single split merging in the kernel writes them as O and LSE.
    let splits = grid_dim_x();
    let in_kernel = p.merge_in_kernel != 0;
    let direct = in_kernel && splits == 1;
    let part = split as usize;
    let o_part = (p.o_part as *mut f32).wrapping_add(part * s.o_elems());
    let lse_part = (p.lse_part as *mut f32).wrapping_add(part * s.row_elems());
    let row_at = |r: u32| {
        (
            seq.q_offset(&s, local_row(r), head(r)),
            seq.row_index(&s, local_row(r), head(r)),
        )
    };
    let quads = d / 4;
    let mut i = tid;
    while i < rows * quads {
        let (r, c) = (i / quads, 4 * (i % quads) as usize);
        let l = row_sum(r);
        let inv = if row_is_empty(l) { 0.0 } else { 1.0 / l };
        let mut sum = [0.0f32; 4];
        for w in 0..WARPS {
            // SAFETY: row r of warp w's staged rows, 16-byte aligned.
            let Cols4(x) = unsafe { *(o_s.add(at(w, r) * stride + c) as *const Cols4) };
            for (a, &y) in sum.iter_mut().zip(&x) {
                *a += y;
            }
        }
        let out = sum.map(|x| x * inv);
        let o_at = row_at(r).0 + c;
        // SAFETY: row r is a query row of the sequence; 16-byte aligned (rows of d f32) in the
        // partials, 8-byte in O.
        unsafe {
            if direct {
                store4::<T>(p.o, o_at, out);
            } else {
                *(o_part.add(o_at) as *mut Cols4) = Cols4(out);
            }
        }
        i += THREADS;
    }
    if tid < rows {
        let l = row_sum(tid);
        let lse = if row_is_empty(l) {
            f32::NEG_INFINITY
        } else {
            (row_max(tid) + log2(l)) * core::f32::consts::LN_2
        };
        let lse_out = if direct { p.lse as *mut f32 } else { lse_part };
        // SAFETY: as above.
        unsafe { *lse_out.add(row_at(tid).1) = lse };
    }
    if in_kernel && !direct {
        let counter =
            (p.split_counters as *mut u32).wrapping_add((block_z() * s.heads_kv + hk) as usize);
        // SAFETY: the host gave each (sequence, K/V head) of the grid a zeroed counter; once
        // the block is last, every split's partials are written and the stage region is free.
        unsafe {
            if arrive_last(counter, splits) {
                let parts = Partials {
                    o_part: p.o_part as *const f32,
                    lse_part: p.lse_part as *const f32,
                    o_elems: s.o_elems(),
                    row_elems: s.row_elems(),
                    o: p.o,
                    lse: p.lse,
                    row: row_at,
                };
                merge_splits::<T, _>(&parts, splits, rows, d, o_s);
            }
        }
    }
}

macro_rules! decode_entries {
    ($($name:ident => $t:ty, $d:literal;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: DecodeParams) {
            // SAFETY: the host validated the tensors and the workspace against `p`.
            unsafe { decode::<$t, { $d / 16 }, { $d / 8 }>(&p) }
        }
    )*};
}

// Named as `attention_host::instances::decode` formats them.
decode_entries! {
    flash_decode_mma_bf16_d64 => Bf16, 64;
    flash_decode_mma_bf16_d128 => Bf16, 128;
    flash_decode_mma_f16_d64 => F16, 64;
    flash_decode_mma_f16_d128 => F16, 128;
}
