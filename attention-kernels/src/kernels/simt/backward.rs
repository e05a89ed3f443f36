//! Algorithm 4 backward with recomputation. Per tile, S and P are rebuilt from Q_i, K_j and the
//! saved LSE_i (P = exp(S − LSE), masked entries 0), the dropout multipliers Z replayed from the
//! same Philox coordinates, and
//!   dP = (dO_i V_jᵀ) ∘ Z,  dS = P ∘ (dP − D_i),
//!   dV_j += (P ∘ Z)ᵀ dO_i,  dK_j += τ dSᵀ Q_i,  dQ_i += τ dS K_j.
//!
//! Kernels: `delta` (D = rowsum(dO ∘ O), first), `kv` (K/V blocks outer: dK_j, dV_j accumulated on
//! chip over every Q block and every query head of the GQA group, dQ by atomics into f32 unless
//! a separate pass computes it), `dq` (the deterministic dQ pass: Q blocks outer, dQ_i on chip)
//! and `dq_convert` (f32 atomics buffer to the storage type).

use crate::abi::params::FlashBackwardParams;
use crate::abi::storage::{Bf16, F16, Storage};
use crate::arch::{
    atomic_add_global, block_dim_x, block_x, entry_points, exp, grid_dim_x, sync_threads,
    sync_threads_or, thread_x, warp_sum,
};
use crate::attn::dropout::dropout_multiplier;
use crate::attn::grid::head_and_sequence;
use crate::attn::mask::{MASKED, allowed_weight};
use crate::attn::score_mod::sink_gradient;
use crate::attn::sequence::Sequence;
use crate::kernels::simt::smem::padded;
use crate::kernels::simt::tile::{
    Arena, Tile, dot, fill, for_each, load_rows, mul_acc, mul_t_acc, product, store_rows,
};

/// D = rowsum(dO ∘ O) for every (batch, head, row), in LSE's layout. One warp per row.
unsafe fn delta<T: Storage>(p: &FlashBackwardParams) {
    let s = &p.shape;
    let warps = block_dim_x() / 32;
    let row = block_x() * warps + thread_x() / 32;
    let lane = thread_x() % 32;
    if row as usize >= s.row_elems() {
        return;
    }
    let i = row % s.n_q;
    let h = (row / s.n_q) % s.heads_q;
    let b = row / (s.n_q * s.heads_q);
    let d = s.head_dim_v;
    let at =
        ((b as usize * s.n_q as usize + i as usize) * s.heads_q as usize + h as usize) * d as usize;
    let mut acc = 0.0f32;
    let mut x = lane;
    while x < d {
        // SAFETY: `at + x` is inside O and dO.
        unsafe {
            acc += (*(p.d_o as *const T).add(at + x as usize)).to_f32()
                * (*(p.o as *const T).add(at + x as usize)).to_f32();
        }
        x += 32;
    }
    let acc = warp_sum(acc);
    if lane == 0 {
        // SAFETY: `row` indexes D.
        unsafe { *(p.delta as *mut f32).add(row as usize) = acc };
    }
}

/// `dsink_h = −Σ_rows e^{sink_h − LSE} · D` over every row of head `h` (batch items and packed
/// sequences alike), after `delta`. Grid `(heads_q)`, one warp per head: a fixed order of
/// addition, so the result is the same on every run.
unsafe fn d_sink(p: &FlashBackwardParams) {
    let s = &p.shape;
    let (h, lane) = (block_x(), thread_x() % 32);
    // SAFETY: the host launches this kernel only with sinks, one block per query head.
    let Some(sink) = (unsafe { p.mods.sink(h) }) else {
        return;
    };
    let acc = sink_gradient(sink, s.batch, s.n_q, |b, i| {
        let row = (b as usize * s.heads_q as usize + h as usize) * s.n_q as usize + i as usize;
        // SAFETY: `row` indexes LSE and D.
        unsafe {
            (
                *(p.lse as *const f32).add(row),
                *(p.delta as *const f32).add(row),
            )
        }
    });
    if lane == 0 {
        // SAFETY: `d_sinks` holds heads_q f32.
        unsafe { *(p.mods.d_sinks as *mut f32).add(h as usize) = acc };
    }
}

/// Rows `i0 .. i0 + rows` of head `h`: Q_i, dO_i, LSE_i, D_i in shared memory.
struct QueryTiles {
    q: Tile,
    d_o: Tile,
    lse: Tile,
    delta: Tile,
}

unsafe fn load_query_block<T: Storage>(
    p: &FlashBackwardParams,
    seq: &Sequence,
    t: &QueryTiles,
    h: u32,
    i0: u32,
    rows: u32,
) {
    let s = &p.shape;
    // SAFETY: rows i0 .. i0 + rows of the sequence exist in Q, dO, LSE and D.
    unsafe {
        load_rows(
            t.q,
            (p.q as *const T).wrapping_add(seq.q_offset(s, i0, h)),
            s.heads_q as usize * s.head_dim as usize,
            rows,
            s.head_dim,
        );
        load_rows(
            t.d_o,
            (p.d_o as *const T).wrapping_add(seq.o_offset(s, i0, h)),
            s.heads_q as usize * s.head_dim_v as usize,
            rows,
            s.head_dim_v,
        );
        for_each(rows, |r| {
            let row = seq.row_index(s, i0 + r, h);
            t.lse.set(0, r, *(p.lse as *const f32).add(row));
            t.delta.set(0, r, *(p.delta as *const f32).add(row));
        });
    }
}

unsafe fn load_kv_block<T: Storage>(
    p: &FlashBackwardParams,
    seq: &Sequence,
    k: Tile,
    v: Tile,
    hk: u32,
    j0: u32,
    cols: u32,
) {
    let s = &p.shape;
    // SAFETY: keys j0 .. j0 + cols of the sequence exist in K and V.
    unsafe {
        load_rows(
            k,
            (p.k as *const T).wrapping_add(seq.k_offset(s, j0, hk)),
            s.heads_kv as usize * s.head_dim as usize,
            cols,
            s.head_dim,
        );
        load_rows(
            v,
            (p.v as *const T).wrapping_add(seq.v_offset(s, j0, hk)),
            s.heads_kv as usize * s.head_dim_v as usize,
            cols,
            s.head_dim_v,
        );
    }
}

/// Rebuilds one tile: for `r < rows`, `c < cols` writes dS into `ds` and, when given, P ∘ Z into
/// `p_drop`. Masked entries are `MASKED` in both, so they add nothing to any gradient. Returns
/// whether this thread wrote a masked entry (the block's vote picks the checked products).
#[allow(clippy::too_many_arguments)]
unsafe fn recompute_tile(
    p: &FlashBackwardParams,
    seq: &Sequence,
    qt: &QueryTiles,
    k: Tile,
    v: Tile,
    ds: Tile,
    p_drop: Option<Tile>,
    h: u32,
    i0: u32,
    rows: u32,
    j0: u32,
    cols: u32,
    key: [u32; 2],
) -> bool {
    let (d, d_v) = (p.shape.head_dim, p.shape.head_dim_v);
    let causal = p.causal != 0;
    // SAFETY: the head's slope exists when ALiBi is on (validated by the host).
    let score_mod = unsafe { p.mods.for_head(h) };
    let mut any_masked = false;
    for_each(rows * cols, |e| {
        let (r, c) = (e / cols, e % cols);
        let (i, j) = (i0 + r, j0 + c);
        let (start, end) = seq.key_range(i, causal, p.mods.window);
        // SAFETY: r < B_r, c < B_c, rows of d elements.
        unsafe {
            // Masked entries, and allowed ones scored −∞ (outside the row's support, as in the
            // reference), are MASKED in both tiles: the products skip them whatever K, V, Q or
            // dO hold. Any other entry has a non-empty row (LSE finite or NaN). `grad` is the
            // modifiers' ∂s'/∂s, which dS carries to dQ and dK.
            let (score, grad) = if start <= j && j < end {
                let s = p.scale * dot(qt.q.row(r), k.row(c), d);
                score_mod.apply(s, i, j, seq.q_len, seq.k_len)
            } else {
                (f32::NEG_INFINITY, 0.0)
            };
            let (pr_drop, d_s) = if score != f32::NEG_INFINITY {
                let pr = exp(score - qt.lse.get(0, r));
                let z = dropout_multiplier(&p.dropout, key, seq.index, h, i, j);
                let dp = dot(qt.d_o.row(r), v.row(c), d_v) * z;
                (
                    pr * z,
                    allowed_weight(pr * (dp - qt.delta.get(0, r)) * grad),
                )
            } else {
                any_masked = true;
                (MASKED, MASKED)
            };
            ds.set(r, c, d_s);
            if let Some(pd) = p_drop {
                pd.set(r, c, pr_drop);
            }
        }
    });
    any_masked
}

/// K/V blocks outer. Grid `(K/V blocks, (heads_kv, sequences) folded)`.
unsafe fn kv<T: Storage>(p: &FlashBackwardParams) {
    let s = &p.shape;
    let (br, bc, d, d_v) = (
        p.blocks.block_rows,
        p.blocks.block_cols,
        s.head_dim,
        s.head_dim_v,
    );
    let Some((hk, sq)) = head_and_sequence(s.heads_kv, p.layout.sequences) else {
        return;
    };
    // SAFETY: `sq` is below the layout's sequence count.
    let seq = unsafe { Sequence::locate(&p.layout, s, sq) };
    let j0 = block_x() * bc;
    if j0 >= seq.k_rows {
        return;
    }
    let cols = bc.min(seq.k_rows - j0);
    // Carved in the order of `smem::backward_kv_floats`.
    let mut a = Arena::new();
    let (k, v) = (a.tile(bc, padded(d)), a.tile(bc, padded(d_v)));
    let (dk, dv) = (a.tile(bc, d), a.tile(bc, d_v));
    let (q, d_o) = (a.tile(br, padded(d)), a.tile(br, padded(d_v)));
    let (p_drop, ds) = (a.tile(br, bc), a.tile(br, bc));
    let qt = QueryTiles {
        q,
        d_o,
        lse: a.vector(br),
        delta: a.vector(br),
    };
    let key = p.dropout.key();
    let group = s.heads_q / s.heads_kv;
    let causal = p.causal != 0;
    // SAFETY: tiles are sized by the host from `smem::backward_kv_floats`; buffers by validation.
    unsafe {
        load_kv_block::<T>(p, &seq, k, v, hk, j0, cols);
        fill(dk, cols, d, 0.0);
        fill(dv, cols, d_v, 0.0);
        // GQA: dK_j, dV_j sum over every query head that reads K/V head hk.
        for h in hk * group..(hk + 1) * group {
            let mut i0 = 0;
            while i0 < seq.q_len {
                let rows = br.min(seq.q_len - i0);
                // Both ends of a row's key range grow with the row: if the block's last row
                // sees no key at or past j0, or its first row none before j0 + cols, no row
                // sees this tile, and the pair is skipped.
                let (first, _) = seq.key_range(i0, causal, p.mods.window);
                let (_, end) = seq.key_range(i0 + rows - 1, causal, p.mods.window);
                if end > j0 && first < j0 + cols {
                    sync_threads();
                    load_query_block::<T>(p, &seq, &qt, h, i0, rows);
                    sync_threads();
                    let masked = recompute_tile(
                        p,
                        &seq,
                        &qt,
                        k,
                        v,
                        ds,
                        Some(p_drop),
                        h,
                        i0,
                        rows,
                        j0,
                        cols,
                        key,
                    );
                    // Tiles without a masked entry (most of them) take the plain products.
                    let checked = sync_threads_or(masked);
                    mul_t_acc(dv, p_drop, qt.d_o, cols, d_v, rows, checked);
                    mul_t_acc(dk, ds, qt.q, cols, d, rows, checked);
                    if p.dq_accum != 0 {
                        let dq = (p.dq_accum as *mut f32).wrapping_add(seq.q_offset(s, i0, h));
                        let stride = s.heads_q as usize * d as usize;
                        for_each(rows * d, |e| {
                            let (r, x) = (e / d, e % d);
                            let mut sum = 0.0f32;
                            if checked {
                                for c in 0..cols {
                                    sum += product::<true>(ds.get(r, c), k.get(c, x));
                                }
                            } else {
                                for c in 0..cols {
                                    sum += product::<false>(ds.get(r, c), k.get(c, x));
                                }
                            }
                            atomic_add_global(
                                dq.add(r as usize * stride + x as usize),
                                p.scale * sum,
                            );
                        });
                    }
                }
                i0 += br;
            }
        }
        sync_threads();
        store_rows(
            (p.dk as *mut T).wrapping_add(seq.k_offset(s, j0, hk)),
            s.heads_kv as usize * d as usize,
            dk,
            p.scale,
            cols,
            d,
        );
        store_rows(
            (p.dv as *mut T).wrapping_add(seq.v_offset(s, j0, hk)),
            s.heads_kv as usize * d_v as usize,
            dv,
            1.0,
            cols,
            d_v,
        );
    }
}

/// Deterministic dQ: Q blocks outer, dQ_i accumulated on chip in a fixed order, written once.
/// Grid `(Q blocks, (heads_q, sequences) folded)`.
unsafe fn dq<T: Storage>(p: &FlashBackwardParams) {
    let s = &p.shape;
    let (br, bc, d) = (p.blocks.block_rows, p.blocks.block_cols, s.head_dim);
    let Some((h, sq)) = head_and_sequence(s.heads_q, p.layout.sequences) else {
        return;
    };
    // SAFETY: `sq` is below the layout's sequence count.
    let seq = unsafe { Sequence::locate(&p.layout, s, sq) };
    let i0 = block_x() * br;
    if i0 >= seq.q_len {
        return;
    }
    let rows = br.min(seq.q_len - i0);
    let hk = s.kv_head(h);
    // Carved in the order of `smem::backward_dq_floats`.
    let mut a = Arena::new();
    let d_v = s.head_dim_v;
    let (q, d_o) = (a.tile(br, padded(d)), a.tile(br, padded(d_v)));
    let (k, v) = (a.tile(bc, padded(d)), a.tile(bc, padded(d_v)));
    let ds = a.tile(br, bc);
    let dq_acc = a.tile(br, d);
    let qt = QueryTiles {
        q,
        d_o,
        lse: a.vector(br),
        delta: a.vector(br),
    };
    let key = p.dropout.key();
    // SAFETY: tiles are sized by the host from `smem::backward_dq_floats`; buffers by validation.
    unsafe {
        load_query_block::<T>(p, &seq, &qt, h, i0, rows);
        fill(dq_acc, rows, d, 0.0);
        let (mut j0, kv_end) =
            seq.block_key_range(i0, i0 + rows - 1, p.causal != 0, p.mods.window, bc);
        while j0 < kv_end {
            let cols = bc.min(seq.k_rows - j0);
            sync_threads();
            load_kv_block::<T>(p, &seq, k, v, hk, j0, cols);
            sync_threads();
            let masked = recompute_tile(p, &seq, &qt, k, v, ds, None, h, i0, rows, j0, cols, key);
            let checked = sync_threads_or(masked);
            mul_acc(dq_acc, None, ds, k, rows, d, cols, checked);
            j0 += bc;
        }
        sync_threads();
        let stride = s.heads_q as usize * d as usize;
        store_rows(
            (p.dq as *mut T).wrapping_add(seq.q_offset(s, i0, h)),
            stride,
            dq_acc,
            p.scale,
            rows,
            d,
        );
    }
}

/// dQ = the f32 atomics buffer, narrowed to the storage type. Grid-stride over Q's elements.
unsafe fn dq_convert<T: Storage>(p: &FlashBackwardParams) {
    let n = p.shape.q_elems();
    let mut e = block_x() as usize * block_dim_x() as usize + thread_x() as usize;
    let step = grid_dim_x() as usize * block_dim_x() as usize;
    while e < n {
        // SAFETY: e < the element count of dQ and of the accumulator.
        unsafe { *(p.dq as *mut T).add(e) = T::from_f32(*(p.dq_accum as *const f32).add(e)) };
        e += step;
    }
}

entry_points! {
    flash_backward_delta_f32 => delta::<f32>(FlashBackwardParams);
    flash_backward_delta_f16 => delta::<F16>(FlashBackwardParams);
    flash_backward_delta_bf16 => delta::<Bf16>(FlashBackwardParams);
    flash_backward_kv_f32 => kv::<f32>(FlashBackwardParams);
    flash_backward_kv_f16 => kv::<F16>(FlashBackwardParams);
    flash_backward_kv_bf16 => kv::<Bf16>(FlashBackwardParams);
    flash_backward_dq_f32 => dq::<f32>(FlashBackwardParams);
    flash_backward_dq_f16 => dq::<F16>(FlashBackwardParams);
    flash_backward_dq_bf16 => dq::<Bf16>(FlashBackwardParams);
    flash_backward_dq_convert_f32 => dq_convert::<f32>(FlashBackwardParams);
    flash_backward_dq_convert_f16 => dq_convert::<F16>(FlashBackwardParams);
    flash_backward_dq_convert_bf16 => dq_convert::<Bf16>(FlashBackwardParams);
}

#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn flash_backward_d_sink(p: FlashBackwardParams) {
    // SAFETY: the host validated the buffers against `p` and launched one warp per query head.
    unsafe { d_sink(&p) }
}
