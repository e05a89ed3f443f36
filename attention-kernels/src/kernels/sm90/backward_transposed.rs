//! The `wgmma` backward's transposed schedule (`WgBackwardConfig::transposed`), d = 192's plain
//! instance: a thread block owns 96 keys of one (batch, kv-head) and three warpgroups, and per Q
//! block (64 rows, every query head of the GQA group, streamed through two stages by the tensor
//! memory accelerator) each warpgroup `w`
//!   computes `S = Q·Kᵀ` and `dP = dO·Vᵀ` for its 32 keys `32w ..` (`m64n32`, rows = queries),
//!   `P = 2^(S·τ·log2 e − LSE·log2 e)` and `dS = P ∘ (dP − D)` in registers (one LSE and one D per
//!   row: two a thread), and writes `P` and `dS` to two shared tiles (queries × keys);
//!   after a barrier, `dQ = dS·K` for head-dim columns `64w ..` (`m64n64` over the 96 keys), and
//!   the transposed `dVᵀ += dOᵀ·P` and `dKᵀ += Qᵀ·dS` for those 64 head-dim rows and all 96 keys
//!   (`m64n96`, both operands from shared memory), kept in registers across the loop.
//! Against the sliced schedule of `backward` (64 keys, two warpgroups), each Q/dO stage and each
//! barrier serves 1.5× the products, every product's operand starts a 64-column panel (no
//! padding of the head dim), and a third warpgroup hides latency. FlashAttention-3 tiles its
//! d = 192 backward this way (`dKV_swapAB`). dQ is added with `red.global.add` per fragment as
//! in `backward`; dK and dV are staged transposed through the K and V tiles at the end.
//! Plain calls only (full-length sequences, no dropout, window, score modifiers or deterministic
//! dQ): the others run `backward`'s sliced instances.

use crate::abi::layout::TensorStrides;
use crate::abi::params::TmaBackwardParams;
use crate::abi::storage::{Bf16, F16};
use crate::arch::{ballot, exp2, opaque, shared_window, sync_threads, sync_threads_or, thread_x};
use crate::arch::{block_x, warp_uniform};
use crate::attn::backward::{first_q_block, needs_mask};
use crate::attn::grid::{head_and_sequence, head_here};
use crate::attn::mask::{
    Exponent, MASKED, hidden, is_masked, quad_any, sanitize_own_chunks, sanitize_row_part,
};
use crate::attn::sequence::Sequence;
use crate::kernels::sm90::WgBackwardConfig;
use crate::tile::cp_async::{ChunkedTile, GlobalRows, wait_all};
use crate::tile::mem::{store_shared_u16, store_shared_u32, store_staged_rows};
use crate::tile::mem_backward::{load_shared_f32x2, load_shared_u32, red_add_f32x2};
use crate::tile::mma::{FragC, each_fragment};
use crate::tile::tma;
use crate::tile::wgmma::{self, Accumulator, Desc, Wgmma};
use crate::tile::{GappedTile, PanelTile, SwizzledTile};

/// Fragments of a warpgroup's `S` and `dP`: 32 keys.
const NS: usize = 4;
/// Fragments of the transposed dK and dV: the block's 96 keys.
const NKV: usize = 12;
/// Fragments of a warpgroup's dQ chain: 64 head-dim columns.
const NDQ: usize = 8;

#[inline(always)]
fn desc(first: (u32, u32, u32), offset: u32) -> Desc {
    Desc::swizzle_128(first.0, first.1, first.2).advanced(offset)
}

#[inline(always)]
unsafe fn backward<T: Wgmma + Exponent, const KD: usize>(p: &TmaBackwardParams, maps: u64) {
    const { assert!(KD == 12) };
    let p_base = &p.base;
    let cfg = WgBackwardConfig {
        head_dim: 16 * KD as u32,
        warpgroups: 3,
        split_head_dim: false,
        tall_q_blocks: false,
    };
    let (d, bc, br) = (cfg.tile_cols(), cfg.block_keys(), cfg.block_rows());
    let threads = cfg.threads();
    let s = p_base.shape;
    let tid = thread_x();
    let group = warp_uniform(tid / 128);
    let (warp, lane) = ((tid / 32) % 4, tid % 32);
    let (g, t) = (lane / 4, lane % 4);
    let causal = p_base.causal != 0;
    let Some((hk, sq)) = head_and_sequence(s.heads_kv, p_base.layout.sequences) else {
        return;
    };
    let kv_block = block_x();
    let seq = Sequence::full(&s, sq);
    let k0 = kv_block * bc;
    if k0 >= seq.k_rows {
        return;
    }
    let heads_per_kv = s.heads_q / s.heads_kv;
    let (n_q, n_k) = (seq.q_len, seq.k_len);
    let (dr, real_chunks) = (s.head_dim, s.head_dim / 8);
    let v_chunks = || opaque(s.head_dim_v) / 8;
    let ts = &p_base.strides;
    let kv_at = |base: u64, strides: &TensorStrides| base + 2 * seq.k_row(strides, 0, hk);
    let stats_row =
        |h: u32| (seq.batch * s.heads_q + h) as u64 * p_base.n_q_pad as u64 + seq.q_start as u64;

    // K, V (96 rows), two stages of Q, dO (64 rows), all `d` columns; the `P` and `dS` tiles
    // (64 queries × 128 key columns, 96 used); two stages of the rows' statistics.
    let smem = shared_window();
    let (kv_bytes, q_bytes) = (bc * d * 2, br * d * 2);
    let score_bytes = br * cfg.score_tile_cols() * 2;
    let k_tile = |base: u32| PanelTile::new(base, bc, d);
    let v_tile = |base: u32| PanelTile::new(base + kv_bytes, bc, d);
    let stages = cfg.stages();
    let stage = |base: u32, st: u32| base + 2 * kv_bytes + st * 2 * q_bytes;
    let q_tile = |base: u32, st: u32| PanelTile::new(stage(base, st), br, d);
    let do_tile = |base: u32, st: u32| PanelTile::new(stage(base, st) + q_bytes, br, d);
    let scores = |base: u32| base + 2 * kv_bytes + stages * 2 * q_bytes;
    let p_tile = |base: u32| PanelTile::new(scores(base), br, cfg.score_tile_cols());
    let ds_tile = |base: u32| PanelTile::new(scores(base) + score_bytes, br, cfg.score_tile_cols());
    let stats = |base: u32, st: u32| scores(base) + 2 * score_bytes + st * 2 * br * 4;
    let stage_of = |i: u32| i % stages;
    let chunked = |tile: PanelTile| GappedTile::new(tile, d / 8, d / 8);

    let first_block = first_q_block(k0, n_q, n_k, causal);
    let per_head = n_q.div_ceil(br).saturating_sub(first_block);
    let iters = per_head * heads_per_kv;
    let head_of = |i: u32| head_here(s.heads_kv) * heads_per_kv + i / per_head;
    let row0_of = |i: u32| (first_block + i % per_head) * br;

    let barrier = |st: u32| smem + cfg.shared_bytes() + st * tma::BARRIER_BYTES;
    let map_bytes = core::mem::size_of::<crate::abi::params::TensorMap>() as u64;
    let fill = |i: u32, st: u32| {
        if tid == 0 {
            let (h, q0) = (head_of(i), row0_of(i));
            let row = stats_row(h) + q0 as u64;
            let at = [h as i32, q0 as i32, seq.batch as i32];
            // SAFETY: the barrier is initialized; the stage is free (every warpgroup passed the
            // barrier after its last read); each panel is 1024-byte aligned; the statistics are
            // padded to whole Q blocks, each 256-byte aligned.
            unsafe {
                tma::arrive_expect_tx(barrier(st), 2 * q_bytes + 2 * br * 4);
                tma::load_bulk(
                    stats(smem, st),
                    p_base.lse_log2 + row * 4,
                    br * 4,
                    barrier(st),
                );
                tma::load_bulk(
                    stats(smem, st) + br * 4,
                    p_base.d_sum + row * 4,
                    br * 4,
                    barrier(st),
                );
                for (tile, map) in [
                    (q_tile(smem, st), maps),
                    (do_tile(smem, st), maps + map_bytes),
                ] {
                    for panel in 0..d / 64 {
                        let dst = tile.chunk_addr(0, 8 * panel);
                        let c = [64 * panel as i32, at[0], at[1], at[2]];
                        tma::load_4d(dst, map, barrier(st), c);
                    }
                }
            }
        }
    };

    // SAFETY: the K and V tiles hold `bc` rows; rows below n_k are inside K and V. Keys past
    // the sequence's length load as zeros and are masked.
    unsafe {
        let rows = |base: u64, strides: &TensorStrides, chunks: u32| GlobalRows {
            base: kv_at(base, strides),
            stride: 2 * strides.seq,
            limit: n_k,
            chunks,
        };
        chunked(k_tile(smem)).fill_async(rows(p_base.k, &ts.k, real_chunks), k0, bc, tid, threads);
        chunked(v_tile(smem)).fill_async(rows(p_base.v, &ts.v, v_chunks()), k0, bc, tid, threads);
    }
    if tid == 0 {
        for st in 0..stages {
            // SAFETY: the barriers lie past the tiles, inside the block's shared memory.
            unsafe { tma::init(barrier(st), 1) };
        }
        tma::fence_barrier_init();
    }
    sync_threads();
    if iters > 0 {
        fill(0, 0);
    }

    // The group's keys of `S`, `dP`, `P` and `dS` (columns), and its head-dim rows of dKᵀ, dVᵀ
    // and columns of dQ.
    let (key0, dim0) = (32 * group, 64 * group);
    // A key whose K row holds a non-finite value scores non-finite against every query: its K
    // row is zeroed (so dQ = dS·K cannot turn a masked 0 into NaN) and its P is MASKED, as in
    // `backward`. Four threads scan each of the 96 rows; bit 2j + c of `k_poison` is this
    // thread's key column 8j + 2t + c.
    let mut k_poison = 0u32;
    let mut k_poisoned = false;
    if iters > 0 {
        wait_all();
        sync_threads();
        let (row, part) = (tid / 4, tid % 4);
        let kt = k_tile(smem);
        // SAFETY: part `part` of row `row` of the K tile, which only this quad touches before
        // the barrier below.
        let bad = unsafe { sanitize_row_part::<T>(|c| kt.chunk_addr(row, c), d / 8, part) };
        let bad = quad_any(bad as u32) != 0;
        if bad {
            wgmma::fence_proxy_async();
        }
        // SAFETY: word `row` of the `dS` tile, first written after the loop's first barrier.
        unsafe { store_shared_u32(ds_tile(smem).chunk_addr(0, 0) + 4 * row, bad as u32) };
        k_poisoned = sync_threads_or(bad);
        if k_poisoned {
            for j in 0..NS as u32 {
                for c in 0..2 {
                    let key = key0 + 8 * j + 2 * t + c;
                    // SAFETY: as above, after the barrier.
                    let flag = unsafe { load_shared_u32(ds_tile(smem).chunk_addr(0, 0) + 4 * key) };
                    k_poison |= flag << (2 * j + c);
                }
            }
        }
    }
    let mut dk = [FragC::default(); NKV];
    let mut dv = [FragC::default(); NKV];
    let reduce_dq = |dq: &[FragC; NDQ], (h, q0): (u32, u32)| {
        let row = q0 + 16 * warp + g;
        let col = (dim0 + 2 * t) as u64;
        let lo = p_base.dq_accum + (seq.q_offset(&s, row, h) as u64 + col) * 4;
        let hi = p_base.dq_accum + (seq.q_offset(&s, row + 8, h) as u64 + col) * 4;
        let inside = q0 + br <= n_q && dim0 + 8 * NDQ as u32 <= dr;
        for (j, f) in dq.iter().enumerate() {
            let [lo0, lo1, hi0, hi1] = f.0;
            let real = dim0 + 8 * (j as u32) < dr;
            let (at_lo, at_hi) = (lo + 32 * j as u64, hi + 32 * j as u64);
            // SAFETY: the row is below n_q and columns col + 8j .. + 2 < dr are inside the
            // accumulator, 8-byte aligned.
            unsafe {
                if inside {
                    red_add_f32x2(at_lo, [lo0, lo1]);
                    red_add_f32x2(at_hi, [hi0, hi1]);
                } else {
                    if real && row < n_q {
                        red_add_f32x2(at_lo, [lo0, lo1]);
                    }
                    if real && row + 8 < n_q {
                        red_add_f32x2(at_hi, [hi0, hi1]);
                    }
                }
            }
        }
    };

    let mut i = 0;
    while i < iters {
        let st = stage_of(i);
        // SAFETY: block i's Q, dO and statistics were issued on its stage's barrier, whose
        // phase completes once per use: the parity of the uses before it.
        unsafe { tma::wait(barrier(st), (i / stages) & 1) };
        let (h, q0) = (head_of(i), row0_of(i));
        let base = opaque(smem);
        // A non-finite Q row: as in `backward`, only a block with a non-finite LSE is scanned.
        // The lane's address recomputed per step (`opaque`): hoisted, it spilled.
        // SAFETY: the stage's statistics have landed.
        let lse2 = unsafe { load_shared_f32x2(stats(base, st) + 8 * (opaque(tid) % 32)) };
        if ballot(!(lse2[0].is_finite() && lse2[1].is_finite())) != 0 {
            // SAFETY: the stage's Q has landed (its barrier); each thread rewrites its own
            // chunks, published by the barrier below.
            unsafe { sanitize_own_chunks::<T, _>(&chunked(q_tile(smem, st)), br, tid, threads) };
        }
        wgmma::fence_proxy_async();
        // Every warpgroup is done with step i − 1 (its stage is refilled next, its `P` and `dS`
        // tiles are rewritten below).
        sync_threads();
        if i + 1 < iters {
            fill(i + 1, stage_of(i + 1));
        }
        let (kt, vt, qt, dot) = (
            k_tile(base),
            v_tile(base),
            q_tile(base, st),
            do_tile(base, st),
        );
        let (pt, dst) = (p_tile(base), ds_tile(base));

        let mut s_blk = [FragC::default(); NS];
        let mut dp = [FragC::default(); NS];
        wgmma::fence();
        let (q_a, k_b) = (qt.k_major(0, 0), kt.k_major(key0, 0));
        for kk in 0..KD as u32 {
            let (a, b) = (
                desc(q_a, qt.k_step_offset(kk)),
                desc(k_b, kt.k_step_offset(kk)),
            );
            // SAFETY: the stage's Q and the block's K are filled and published.
            unsafe { s_blk.mma_ss::<T>(a, b, kk > 0) };
        }
        wgmma::commit();
        let (do_a, v_b) = (dot.k_major(0, 0), vt.k_major(key0, 0));
        for kk in 0..KD as u32 {
            let (a, b) = (
                desc(do_a, dot.k_step_offset(kk)),
                desc(v_b, vt.k_step_offset(kk)),
            );
            // SAFETY: as above.
            unsafe { dp.mma_ss::<T>(a, b, kk > 0) };
        }
        wgmma::commit();
        wgmma::wait::<1>();
        s_blk.pin();

        // The thread's rows of the Q block: 16 · warp + g and + 8, recomputed per step
        // (`opaque`): the store addresses derived from them, hoisted, spilled.
        let r_lo = opaque(16 * warp + g);
        let r_hi = r_lo + 8;
        // SAFETY: rows r_lo, r_hi are inside the stage's statistics.
        let (lse_lo, lse_hi, d_lo, d_hi) = unsafe {
            let at = |r: u32| stats(base, st) + 4 * r;
            (
                load_shared_u32(at(r_lo)),
                load_shared_u32(at(r_hi)),
                load_shared_u32(at(br + r_lo)),
                load_shared_u32(at(br + r_hi)),
            )
        };
        let lse = [f32::from_bits(lse_lo), f32::from_bits(lse_hi)];
        let d_row = [f32::from_bits(d_lo), f32::from_bits(d_hi)];
        // Element e of a fragment: row r_lo (e < 2) or r_hi, key column 2t + e % 2.
        each_fragment!(s_blk, |_j, f| {
            for e in 0..4 {
                f.0[e] = exp2(f.0[e] * p_base.scale_log2 - lse[e / 2]);
            }
        });
        // Rows past n_q have LSE·log2 e = +∞ (P = 0 already); keys past n_k and causally hidden
        // pairs are masked.
        let masked = needs_mask(q0, k0, bc, n_q, n_k, causal);
        if masked {
            each_fragment!(s_blk, |j, f| {
                for e in 0..4 {
                    let row = q0 + if e < 2 { r_lo } else { r_hi };
                    let key = k0 + key0 + 8 * j as u32 + 2 * t + (e % 2) as u32;
                    let out = row >= n_q || hidden(row, key, n_q, n_k, causal);
                    f.0[e] = if out { MASKED } else { f.0[e] };
                }
            });
        }
        if k_poisoned {
            each_fragment!(s_blk, |j, f| {
                for e in 0..4 {
                    let poisoned = (k_poison >> (2 * j + e % 2)) & 1 != 0;
                    f.0[e] = if poisoned { MASKED } else { f.0[e] };
                }
            });
        }
        let skip = masked || k_poisoned;
        // Element pairs (e, e + 1) of fragment j to rows r_lo / r_hi, key column
        // `key0 + 8j + 2t` of `tile`.
        let store = |tile: PanelTile, frags: &[FragC; NS]| {
            for (j, f) in frags.iter().enumerate() {
                let c = (key0 + 8 * j as u32) / 8;
                // SAFETY: the warp's own rows, the group's own key columns.
                unsafe {
                    store_shared_u32(tile.chunk_addr(r_lo, c) + 4 * t, T::pack(f.0[0], f.0[1]));
                    store_shared_u32(tile.chunk_addr(r_hi, c) + 4 * t, T::pack(f.0[2], f.0[3]));
                }
            }
        };
        store(pt, &s_blk);
        wgmma::wait::<0>();
        dp.pin();
        each_fragment!(dp, s_blk, |_j, f, pf| {
            for e in 0..4 {
                let ds = pf.0[e] * (f.0[e] - d_row[e / 2]);
                // A masked P gives dS = 0 even where dP (a masked V) or D is not finite.
                f.0[e] = if skip && is_masked(pf.0[e]) { 0.0 } else { ds };
            }
        });
        store(dst, &dp);
        wgmma::fence_proxy_async();
        // dQ, dV and dK read every warpgroup's keys of `P` and `dS`.
        sync_threads();

        let mut dq = [FragC::default(); NDQ];
        wgmma::fence();
        let (ds_a, k_b) = (dst.k_major(0, 0), kt.mn_major(0, dim0));
        for kk in 0..(bc / 16) {
            let (a, b) = (
                desc(ds_a, dst.k_step_offset(kk)),
                desc(k_b, PanelTile::mn_step_offset(16 * kk)),
            );
            // SAFETY: keys 16kk .. 16kk + 16 of the `dS` and K tiles are written.
            unsafe { dq.mma_ss_trans_b::<T>(a, b, kk > 0) };
        }
        wgmma::commit();
        // dVᵀ += dOᵀ·P and dKᵀ += Qᵀ·dS: A the stage's head-dim rows `dim0 ..` (MN-major), B the
        // block's 96 keys (MN-major), over the Q block's 64 rows.
        for (acc, a_tile, b_tile) in [(&mut dv, dot, pt), (&mut dk, qt, dst)] {
            let (a0, b0) = (a_tile.mn_major(0, dim0), b_tile.mn_major(0, 0));
            for kk in 0..(br / 16) {
                let step = PanelTile::mn_step_offset(16 * kk);
                // SAFETY: every warpgroup's keys of `P` and `dS` are written (the barrier); the
                // stage's dO and Q are filled.
                unsafe { acc.mma_ss_trans::<T>(desc(a0, step), desc(b0, step), true) };
            }
            wgmma::commit();
        }
        wgmma::wait::<2>();
        dq.pin();
        reduce_dq(&dq, (h, q0));
        // dV and dK read the `P` and `dS` tiles and the stage, which the next step's first
        // barrier hands back.
        wgmma::wait::<0>();
        i += 1;
    }

    wgmma::wait::<0>();
    dk.pin();
    dv.pin();

    // Stage dK (× τ) and dV row-major (one key per row) through the K and V tiles once every
    // warpgroup is done reading them: element (head-dim row r, key column c) of a transposed
    // accumulator is element (c, r) of the tile.
    wait_all();
    sync_threads();
    let (k_out, v_out) = (
        SwizzledTile::new(smem, d),
        SwizzledTile::new(smem + kv_bytes, d),
    );
    for (tile, acc, scale) in [(k_out, &dk, p_base.scale), (v_out, &dv, 1.0)] {
        for (j, f) in acc.iter().enumerate() {
            for e in 0..4 {
                let dim = dim0 + 16 * warp + g + 8 * (e / 2) as u32;
                let key = 8 * j as u32 + 2 * t + (e % 2) as u32;
                let bits = T::pack(scale * f.0[e], 0.0) & 0xffff;
                // SAFETY: key < 96 rows and dim < d columns of the tile.
                unsafe { store_shared_u16(tile.chunk_addr(key, dim / 8) + 2 * (dim % 8), bits) };
            }
        }
    }
    sync_threads();
    for (tile, dst, strides, chunks) in [
        (k_out, p_base.dk, &ts.dk, real_chunks),
        (v_out, p_base.dv, &ts.dv, v_chunks()),
    ] {
        // SAFETY: the chunks are inside the tile; the global rows below the sequence's key rows
        // are its dK or dV rows.
        unsafe {
            store_staged_rows(
                tile,
                (bc, chunks),
                (kv_at(dst, strides), 2 * strides.seq),
                (k0, seq.k_rows),
                (tid, threads),
            )
        };
    }
}

macro_rules! entry_points {
    ($($name:ident => $t:ty;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: TmaBackwardParams) {
            let maps = crate::tile::tma::param_maps!($name);
            // SAFETY: the host validated the buffers against `p`, ran the preprocess kernel on
            // the workspace, encoded the tensor maps and launched the configuration's grid,
            // block and shared memory.
            unsafe { backward::<$t, 12>(&p, maps) }
        }
    )*};
}

entry_points! {
    flash_wgmma_backward_bf16_d192_g3 => Bf16;
    flash_wgmma_backward_f16_d192_g3 => F16;
}
