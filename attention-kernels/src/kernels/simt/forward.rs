//! Algorithm 1 forward in two schedules over the same tile step (`merge_kv_block`):
//! - row-owned: a thread block owns Q_i and streams every K/V block, keeping (m_i, ℓ_i, O_i) on
//!   chip and writing O_i and LSE_i once;
//! - paper: one launch per K/V block j (K/V outer), the grid over Q blocks (inner); O (normalised,
//!   f32), ℓ and m live in global memory between launches, the last launch writes O and LSE.
//!
//! Grid `(Q blocks, heads_q, sequences)`, any block size that is a multiple of 32.

use crate::abi::params::FlashForwardParams;
use crate::abi::storage::{Bf16, F16, Storage};
use crate::arch::{
    block_dim_x, block_x, entry_points, exp, ln, sync_threads, sync_threads_or, sync_warp,
    thread_x, warp_max, warp_sum,
};
use crate::attn::dropout::dropout_multiplier;
use crate::attn::grid::head_and_sequence;
use crate::attn::mask::{MASKED, row_is_empty};
use crate::attn::score_mod::with_sink;
use crate::attn::sequence::Sequence;
use crate::kernels::simt::smem::padded;
use crate::kernels::simt::tile::{Arena, Tile, dot, fill, for_each, load_rows, mul_acc};

/// The query block a thread block owns: rows `i0 .. i0 + rows` (local) of head `h` of `seq`.
struct QueryBlock {
    seq: Sequence,
    h: u32,
    hk: u32,
    i0: u32,
    rows: u32,
}

impl QueryBlock {
    /// `None` when the sequence has fewer query blocks than the grid (packed sequences differ).
    unsafe fn locate(p: &FlashForwardParams) -> Option<QueryBlock> {
        let (h, s) = head_and_sequence(p.shape.heads_q, p.layout.sequences)?;
        // SAFETY: `s` is below the layout's sequence count.
        let seq = unsafe { Sequence::locate(&p.layout, &p.shape, s) };
        let i0 = block_x() * p.blocks.block_rows;
        if i0 >= seq.q_len {
            return None;
        }
        let rows = p.blocks.block_rows.min(seq.q_len - i0);
        Some(QueryBlock {
            seq,
            h,
            hk: p.shape.kv_head(h),
            i0,
            rows,
        })
    }
}

/// The shared-memory tiles, carved in the order of `smem::forward_floats`.
struct Tiles {
    q: Tile,
    k: Tile,
    v: Tile,
    s: Tile,
    acc: Tile,
    row_max: Tile,
    row_sum: Tile,
    rescale: Tile,
}

impl Tiles {
    /// `d` columns of Q and K, `d_v` of V and the O accumulator.
    fn carve(br: u32, bc: u32, d: u32, d_v: u32) -> Tiles {
        let mut a = Arena::new();
        Tiles {
            q: a.tile(br, padded(d)),
            k: a.tile(bc, padded(d)),
            v: a.tile(bc, d_v),
            s: a.tile(br, bc),
            acc: a.tile(br, d_v),
            row_max: a.vector(br),
            row_sum: a.vector(br),
            rescale: a.vector(br),
        }
    }
}

/// Loads Q_i (stays resident for every K/V block).
unsafe fn load_query<T: Storage>(p: &FlashForwardParams, qb: &QueryBlock, t: &Tiles) {
    let s = &p.shape;
    let q = (p.q as *const T).wrapping_add(qb.seq.q_offset(s, qb.i0, qb.h));
    // SAFETY: rows i0 .. i0 + rows of the sequence exist in Q.
    unsafe {
        load_rows(
            t.q,
            q,
            s.heads_q as usize * s.head_dim as usize,
            qb.rows,
            s.head_dim,
        )
    };
}

/// Merges K/V block `j0 .. j0 + B_c` into the row states (m_i, ℓ_i) and the unnormalised O_i
/// accumulator: S = τ·Q_i K_jᵀ masked before the row max, m_new = max(m, rowmax S),
/// P̃ = exp(S − m_new), ℓ ← e^{m − m_new}ℓ + rowsum P̃, O ← e^{m − m_new}O + (Z ∘ P̃)V_j.
/// A row whose state and tile are both empty keeps m = −∞ and takes the identity branch.
unsafe fn merge_kv_block<T: Storage>(
    p: &FlashForwardParams,
    qb: &QueryBlock,
    t: &Tiles,
    j0: u32,
    key: [u32; 2],
) {
    let s = &p.shape;
    let (d, d_v) = (s.head_dim, s.head_dim_v);
    let cols = p.blocks.block_cols.min(qb.seq.k_rows - j0);
    // The previous block's readers of K_j, V_j and S are done before they are overwritten.
    sync_threads();
    // SAFETY: keys j0 .. j0 + cols of the sequence exist in K and V; the tiles hold B_c rows.
    unsafe {
        load_rows(
            t.k,
            (p.k as *const T).wrapping_add(qb.seq.k_offset(s, j0, qb.hk)),
            s.heads_kv as usize * d as usize,
            cols,
            d,
        );
        load_rows(
            t.v,
            (p.v as *const T).wrapping_add(qb.seq.v_offset(s, j0, qb.hk)),
            s.heads_kv as usize * d_v as usize,
            cols,
            d_v,
        );
    }
    sync_threads();

    let causal = p.causal != 0;
    // SAFETY: the head's slope exists when ALiBi is on (validated by the host).
    let score_mod = unsafe { p.mods.for_head(qb.h) };
    let (q_len, k_len) = (qb.seq.q_len, qb.seq.k_len);
    for_each(qb.rows * cols, |e| {
        let (r, c) = (e / cols, e % cols);
        let (i, j) = (qb.i0 + r, j0 + c);
        let (start, end) = qb.seq.key_range(i, causal, p.mods.window);
        // SAFETY: r < B_r, c < B_c.
        unsafe {
            let score = if start <= j && j < end {
                let s = p.scale * dot(t.q.row(r), t.k.row(c), d);
                score_mod.apply(s, i, j, q_len, k_len).0
            } else {
                f32::NEG_INFINITY
            };
            t.s.set(r, c, score);
        }
    });
    sync_threads();

    // One warp per row: row max, exponentials, row sum; the rescale factor for the accumulator.
    let (warp, lane, warps) = (thread_x() / 32, thread_x() % 32, block_dim_x() / 32);
    let mut any_masked = false;
    let mut r = warp;
    while r < qb.rows {
        // SAFETY: r < rows, columns below `cols`, state vectors hold B_r.
        unsafe {
            let m_old = t.row_max.get(0, r);
            let mut tile_max = f32::NEG_INFINITY;
            let mut c = lane;
            while c < cols {
                tile_max = tile_max.max(t.s.get(r, c));
                c += 32;
            }
            let m_new = m_old.max(warp_max(tile_max));
            let mut tile_sum = 0.0f32;
            c = lane;
            while c < cols {
                // A −∞ score (masked, or −∞ at an allowed key) leaves the row's support: P̃ is the
                // MASKED sentinel, which the product with V skips whatever V holds. With
                // m_new = −∞ every score is −∞, so exp(−∞ − −∞) is never evaluated.
                let sc = t.s.get(r, c);
                let masked = sc == f32::NEG_INFINITY;
                any_masked |= masked;
                let pr = if masked { MASKED } else { exp(sc - m_new) };
                tile_sum += pr;
                // ℓ sums the undropped P̃; only the product with V sees the dropout multiplier.
                let z = dropout_multiplier(&p.dropout, key, qb.seq.index, qb.h, qb.i0 + r, j0 + c);
                t.s.set(r, c, if masked { MASKED } else { pr * z });
                c += 32;
            }
            let tile_sum = warp_sum(tile_sum);
            // Every lane has read m_old before lane 0 overwrites the row's state.
            sync_warp();
            if lane == 0 {
                let alpha = if m_new == f32::NEG_INFINITY {
                    1.0
                } else {
                    exp(m_old - m_new)
                };
                t.rescale.set(0, r, alpha);
                t.row_sum.set(0, r, alpha * t.row_sum.get(0, r) + tile_sum);
                t.row_max.set(0, r, m_new);
            }
        }
        r += warps;
    }
    // Tiles without a masked entry (most of them) take the plain product.
    let checked = sync_threads_or(any_masked);
    // SAFETY: extents are inside the carved tiles.
    unsafe {
        mul_acc(
            t.acc,
            Some(t.rescale),
            t.s,
            t.v,
            qb.rows,
            d_v,
            cols,
            checked,
        )
    };
}

/// Writes O_i = acc / ℓ_i in the storage type and LSE_i = m_i + log ℓ_i; a row with no allowed
/// key (ℓ = 0) gets O = 0 and LSE = −∞, a NaN row (ℓ NaN) NaN in both. With a sink logit, ℓ and
/// LSE include it (`score_mod::with_sink`): an empty row gets O = 0 and LSE = sink.
unsafe fn write_output<T: Storage>(p: &FlashForwardParams, qb: &QueryBlock, t: &Tiles) {
    let s = &p.shape;
    let d = s.head_dim_v;
    let o = (p.o as *mut T).wrapping_add(qb.seq.o_offset(s, qb.i0, qb.h));
    let stride = s.heads_q as usize * d as usize;
    // SAFETY: the head's sink exists when sinks are on (validated by the host).
    let sink = unsafe { p.mods.sink(qb.h) };
    // (LSE, the factor of the unnormalised O) of row r.
    let finish = |r: u32| {
        // SAFETY: r < rows of the block.
        let (m, l) = unsafe { (t.row_max.get(0, r), t.row_sum.get(0, r)) };
        match sink {
            Some(sink) => with_sink(m, l, sink),
            None if row_is_empty(l) => (f32::NEG_INFINITY, 0.0),
            None => (m + ln(l), 1.0 / l),
        }
    };
    sync_threads();
    for_each(qb.rows * d, |e| {
        let (r, x) = (e / d, e % d);
        // SAFETY: r < rows of the block, x < d.
        unsafe {
            let l = t.row_sum.get(0, r);
            let out = match sink {
                _ if row_is_empty(l) => 0.0,
                Some(_) => t.acc.get(r, x) * finish(r).1,
                None => t.acc.get(r, x) / l,
            };
            *o.add(r as usize * stride + x as usize) = T::from_f32(out);
        }
    });
    for_each(qb.rows, |r| {
        // SAFETY: r < rows of the block; LSE holds every row.
        unsafe { *(p.lse as *mut f32).add(qb.seq.row_index(s, qb.i0 + r, qb.h)) = finish(r).0 };
    });
}

/// Empty state: m = −∞, ℓ = 0, O = 0 (`d_v` columns).
unsafe fn init_state(qb: &QueryBlock, t: &Tiles, d_v: u32) {
    // SAFETY: extents are inside the carved tiles.
    unsafe {
        fill(t.row_max, 1, qb.rows, f32::NEG_INFINITY);
        fill(t.row_sum, 1, qb.rows, 0.0);
        fill(t.acc, qb.rows, d_v, 0.0);
    }
}

unsafe fn row_owned<T: Storage>(p: &FlashForwardParams) {
    // SAFETY: the host launched the grid the parameters describe.
    let Some(qb) = (unsafe { QueryBlock::locate(p) }) else {
        return;
    };
    let (d, d_v) = (p.shape.head_dim, p.shape.head_dim_v);
    let t = Tiles::carve(p.blocks.block_rows, p.blocks.block_cols, d, d_v);
    let key = p.dropout.key();
    // SAFETY: tiles are sized by the host from `smem::forward_floats`.
    unsafe {
        load_query::<T>(p, &qb, &t);
        init_state(&qb, &t, d_v);
        // Blocks no row of the Q block sees (causal, windowed) are skipped.
        let (mut j0, kv_end) = qb.seq.block_key_range(
            qb.i0,
            qb.i0 + qb.rows - 1,
            p.causal != 0,
            p.mods.window,
            p.blocks.block_cols,
        );
        while j0 < kv_end {
            merge_kv_block::<T>(p, &qb, &t, j0, key);
            j0 += p.blocks.block_cols;
        }
        write_output::<T>(p, &qb, &t);
    }
}

unsafe fn paper<T: Storage>(p: &FlashForwardParams) {
    // SAFETY: the host launched the grid the parameters describe.
    let Some(qb) = (unsafe { QueryBlock::locate(p) }) else {
        return;
    };
    let s = &p.shape;
    // The O state has O's rows: `d_v` columns.
    let d = s.head_dim_v;
    let t = Tiles::carve(p.blocks.block_rows, p.blocks.block_cols, s.head_dim, d);
    let stride = s.heads_q as usize * d as usize;
    let o_state = (p.o_state as *mut f32).wrapping_add(qb.seq.o_offset(s, qb.i0, qb.h));
    let row = |r: u32| qb.seq.row_index(s, qb.i0 + r, qb.h);
    // SAFETY: tiles are sized by the host; the state buffers hold every row of O and LSE.
    unsafe {
        load_query::<T>(p, &qb, &t);
        if p.kv_block == 0 {
            init_state(&qb, &t, d);
        } else {
            // Resume (m_i, ℓ_i, O_i) from global memory; the accumulator holds ℓ_i·O_i.
            for_each(qb.rows, |r| {
                t.row_max.set(0, r, *(p.row_max as *const f32).add(row(r)));
                t.row_sum.set(0, r, *(p.row_sum as *const f32).add(row(r)));
            });
            for_each(qb.rows * d, |e| {
                let (r, x) = (e / d, e % d);
                let l = *(p.row_sum as *const f32).add(row(r));
                t.acc
                    .set(r, x, l * *o_state.add(r as usize * stride + x as usize));
            });
        }
        let j0 = p.kv_block * p.blocks.block_cols;
        let (first, end) = qb.seq.block_key_range(
            qb.i0,
            qb.i0 + qb.rows - 1,
            p.causal != 0,
            p.mods.window,
            p.blocks.block_cols,
        );
        if j0 < qb.seq.k_rows && first <= j0 && j0 < end {
            merge_kv_block::<T>(p, &qb, &t, j0, p.dropout.key());
        }
        if p.last != 0 {
            write_output::<T>(p, &qb, &t);
            return;
        }
        sync_threads();
        for_each(qb.rows * d, |e| {
            let (r, x) = (e / d, e % d);
            let l = t.row_sum.get(0, r);
            *o_state.add(r as usize * stride + x as usize) = if row_is_empty(l) {
                0.0
            } else {
                t.acc.get(r, x) / l
            };
        });
        for_each(qb.rows, |r| {
            *(p.row_max as *mut f32).add(row(r)) = t.row_max.get(0, r);
            *(p.row_sum as *mut f32).add(row(r)) = t.row_sum.get(0, r);
        });
    }
}

entry_points! {
    flash_forward_f32 => row_owned::<f32>(FlashForwardParams);
    flash_forward_f16 => row_owned::<F16>(FlashForwardParams);
    flash_forward_bf16 => row_owned::<Bf16>(FlashForwardParams);
    flash_forward_paper_f32 => paper::<f32>(FlashForwardParams);
    flash_forward_paper_f16 => paper::<F16>(FlashForwardParams);
    flash_forward_paper_bf16 => paper::<Bf16>(FlashForwardParams);
}
