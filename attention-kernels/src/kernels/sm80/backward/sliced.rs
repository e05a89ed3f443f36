//! The main backward kernel past d = 128 (`TcBackwardConfig::sliced`): `mainloop`'s kernel with
//! the head dim split into slices. A copy rather than a generalization of it, so that the d <= 128
//! instances compile to main's code: with the loop generalized (and `stage_fragments`,
//! `TcBackwardConfig::needs_mask` changed under it), LLVM reordered them enough for ptxas to
//! spill (the deterministic d = 128 ones 112 bytes of stores, 204 of loads).
//!
//! FlashAttention-2 schedule (K/V outer, Q inner).
//!
//! A thread block owns one K/V block of `16 · WARPS` keys of one (batch, kv-head); warp `w` owns
//! keys `16w .. 16w + 16` and keeps their dK and dV accumulators in registers across the whole
//! loop. The loop visits every Q block (of every query head of the GQA group) that can see the
//! block's keys; Q, dO and the rows' statistics stream through two shared stages (`cp.async`
//! fills block `i + 1` while block `i` is computed), or one where two do not fit (d = 256,
//! filled for block `i + 1` while block `i`'s dQ is computed). Per Q block, all on `mma.sync`, transposed so
//! that each warp's products are row blocks of its own keys:
//!   `Sᵀ = K·Qᵀ`, `Pᵀ = 2^(Sᵀ·τ·log2 e − LSE·log2 e)`, `dV += Pᵀ·dO`, `dPᵀ = V·dOᵀ`,
//!   `dSᵀ = Pᵀ ∘ (dPᵀ − D)`, `dK += dSᵀ·Q`;
//! `Pᵀ` and `dSᵀ` go from accumulators straight to A operands (see `tile::mma`). `dQ = dS·K` needs
//! `dS` by query rows: `dSᵀ` goes through shared memory, each warp then computes 16 query rows of
//! dQ (all columns with 4 warps, half of them with 8) and adds them into the f32 accumulator with
//! `red.global.add`: one atomic per dQ element per visited K/V block, so 128-key blocks (8 warps)
//! send half as many as 64-key ones.
//!
//! The `GENERAL` instances take key lengths, packed sequences and dropout, as the `wgmma`
//! backward's do: the sequence is located from the layout (`grid.z` is the sequence; rows past a
//! packed sequence's end are masked, since their statistics belong to the next one; a K/V block
//! past the sequence's keys visits no Q block) and dropout gives `dV += (P∘Z)ᵀ·dO` and
//! `dS = P ∘ (dP∘Z − D)` with the exact kernels' Philox draws. The `Pᵀ` tile keeps P (dS needs it
//! where Z = 0): dV's operands drop elements from it as they are loaded, and dV is multiplied by
//! `1/(1 − p)` once at the end. The `MODS` instances add the local window, softcap and ALiBi;
//! the two flags are independent. Instances without `GENERAL` take the sequence from the kernel
//! parameters.
//!
//! The `SLICED` instances (d = 192, 256; 8 warps) split the head dim as well as the keys: warps
//! `w` and `w + 4` own the same 16 keys of a 64-key block, and warp `w` the head-dim slice
//! `w / 4` of their dK, dV and dQ (`BACKWARD_SLICE_COLS`: 128, and 64 for the last one of
//! d = 192, which uses the first half of the accumulators), so the accumulators fit in registers.
//! Each warp recomputes `Sᵀ`, `Pᵀ`, `dPᵀ` and `dSᵀ` of its keys over the whole head dim, in a
//! `dSᵀ` tile of its slice.

use crate::abi::layout::TensorStrides;
use crate::abi::params::TensorCoreBackwardParams;
use crate::abi::storage::{Bf16, F16};
use crate::arch::sync_threads_or;
use crate::arch::{block_x, exp2, opaque, shared_window, sync_threads, sync_warp, thread_x};
use crate::attn::backward::{
    Pair, dq_adds_before, dq_semaphore, window_needs_mask, window_q_blocks,
};
use crate::attn::dropout::{drop_operand, transposed_keep_bits};
use crate::attn::grid::{head_and_sequence, head_here};
use crate::attn::mask::hidden;
use crate::attn::mask::{Exponent, MASKED, chunk_non_finite, sanitize_own_chunks, sanitize_pair};
use crate::attn::score_mod::{ScoreMod, Window, key_range};
use crate::attn::sequence::Sequence;
use crate::kernels::BACKWARD_SLICE_COLS;
use crate::kernels::sm80::backward::TcBackwardConfig;
use crate::tile::SwizzledTile;
use crate::tile::cp_async::{ChunkedTile, GlobalRows, copy4, copy16, wait_all};
use crate::tile::mem::{load_shared_16, stage_fragments_at, store_global_16, store_shared_u32};
use crate::tile::mem_backward::{
    load_shared_f32x2, load_shared_u32, red_add_f32, release_store, wait_equal_acquire,
};
use crate::tile::mma::{FragB, FragC, each_fragment};

/// `b` with its non-finite elements replaced by 0.
#[inline(always)]
fn sanitize_frag<T: Exponent>(b: FragB) -> FragB {
    FragB([sanitize_pair::<T>(b.0[0]).0, sanitize_pair::<T>(b.0[1]).0])
}

/// Stores an A operand built from accumulators (`MmaElem::pack_a`) row-major into rows
/// `row0 .. row0 + 16`, chunks `c`, `c + 1` of `tile` (`SwizzledTile::quad_addrs`).
///
/// # Safety
/// The rows and chunks must lie inside the tile.
#[inline(always)]
unsafe fn store_quad(tile: SwizzledTile, row0: u32, c: u32, g: u32, t: u32, a: [u32; 4]) {
    let at = tile.quad_addrs(row0, c, g, t);
    // SAFETY: forwarded to the caller. Four plain stores: an iterator over the arrays would
    // keep them in local memory.
    unsafe {
        store_shared_u32(at[0], a[0]);
        store_shared_u32(at[1], a[1]);
        store_shared_u32(at[2], a[2]);
        store_shared_u32(at[3], a[3]);
    }
}

/// Stages the warp's dK or dV (`stage_fragments`) into chunks `col0 / 8 ..` of its 16 rows from
/// `row0`: all `N` fragments, or the first 8 of a `narrow` slice (the last of d = 192). A function
/// called once per tensor, not a loop over the two: LLVM left such a loop rolled, and the
/// accumulators it indexed in local memory.
///
/// # Safety
/// As for `stage_fragments`, with the chunks the slice stages.
#[inline(always)]
unsafe fn stage_slice<T: Pair, const N: usize>(
    tile: SwizzledTile,
    (row0, col0, narrow): (u32, u32, bool),
    acc: &[FragC; N],
    scale: f32,
    lane: u32,
) {
    // SAFETY: forwarded to the caller.
    unsafe {
        match acc.first_chunk::<8>() {
            Some(half) if narrow => {
                stage_fragments_at::<T, 8>(tile, (row0, col0 / 8), half, scale, lane)
            }
            _ => stage_fragments_at::<T, N>(tile, (row0, col0 / 8), acc, scale, lane),
        }
    }
}

/// Generic over `KD = d / 16`, `ND` (n-tiles of dK, dV: `d / 8`, or a slice's 16), `STAGES`,
/// `NQ = block_rows / 8` (n-tiles of `Sᵀ`),
/// `NQP = NQ / 2` (k-steps over the Q block), `WARPS`, and `DQ` (dQ n-tiles computed and sent to
/// the accumulator at a time), so every register array has a compile-time size and every loop over
/// one unrolls.
#[inline(always)]
unsafe fn backward<
    T: Pair + Exponent,
    const KD: usize,
    const ND: usize,
    const NQ: usize,
    const NQP: usize,
    const WARPS: usize,
    const DQ: usize,
    const GENERAL: bool,
    const MODS: bool,
    const DETERMINISTIC: bool,
    const SLICED: bool,
    const STAGES: u32,
>(
    p: &TensorCoreBackwardParams,
) {
    const {
        assert!(NQ == 2 * NQP && KD >= 4 && NQ == 8 && WARPS.is_multiple_of(4));
        // dQ: 16 rows per warp, the block's 64 rows over 4 warps, columns over WARPS / 4 (or
        // each warp its slice).
        assert!(if SLICED {
            ND == 16 && WARPS == 4 * KD.div_ceil(8) && ND.is_multiple_of(DQ)
        } else {
            ND == 2 * KD && (ND / (WARPS / 4)).is_multiple_of(DQ)
        });
        assert!(DQ.is_multiple_of(2) && (STAGES == 1 || STAGES == 2));
        assert!(!(DETERMINISTIC && (GENERAL || MODS)));
    };
    // `TcBackwardConfig::block_keys` and `ds_tiles` of the generics, spelled out: a call left
    // for LLVM to fold reordered the d = 128 instances' code enough for ptxas to spill.
    let (d, bc, br) = (
        16 * KD as u32,
        if SLICED { 64 } else { 16 * WARPS as u32 },
        8 * NQ as u32,
    );
    let ds_tiles = if SLICED { WARPS as u32 / 4 } else { 1 };
    let threads = 32 * WARPS as u32;
    let s = p.shape;
    let (tid, warp, lane) = (thread_x(), thread_x() / 32, thread_x() % 32);
    let causal = p.causal != 0;
    let Some((hk, sq)) = head_and_sequence(s.heads_kv, p.layout.sequences) else {
        return;
    };
    let kv_block = block_x();
    let seq = if GENERAL {
        // SAFETY: `sq` is below the sequence count of a validated layout.
        unsafe { Sequence::locate(&p.layout, &s, sq) }
    } else {
        Sequence::full(&s, sq)
    };
    let k0 = kv_block * bc;
    if GENERAL && k0 >= seq.k_rows {
        // The grid covers the longest sequence; this one is shorter. The whole block leaves.
        return;
    }
    let (n_q, n_k) = (seq.q_len, seq.k_len);
    let group = s.heads_q / s.heads_kv;

    // Rows in memory hold the real head dims (`dr` for Q, K, dQ and dK, `head_dim_v` for V, O,
    // dO and dV); the tiles hold `d`, zeros past them.
    // V's chunk count is read anew at each use (`opaque`): held across the loop it costs the
    // wide instances spills.
    let real_chunks = s.head_dim / 8;
    let v_chunks = || opaque(s.head_dim_v) / 8;
    let ts = &p.strides;
    // Byte address of the sequence's key row 0 of head hk in K-shaped tensors.
    let kv_at = |base: u64, strides: &TensorStrides| base + 2 * seq.k_row(strides, 0, hk);
    // Row of (the sequence's row 0, head h) in the padded statistics.
    let stats_row =
        |h: u32| (seq.batch * s.heads_q + h) as u64 * p.n_q_pad as u64 + seq.q_start as u64;

    let smem = shared_window();
    let (kv_bytes, q_bytes) = (bc * d * 2, br * d * 2);
    let k_tile = SwizzledTile::new(smem, d);
    let v_tile = SwizzledTile::new(smem + kv_bytes, d);
    let stage_base = smem + 2 * kv_bytes;
    let q_tile = |st: u32| SwizzledTile::new(stage_base + st * 2 * q_bytes, d);
    let do_tile = |st: u32| SwizzledTile::new(stage_base + st * 2 * q_bytes + q_bytes, d);
    let ds_base = stage_base + STAGES * 2 * q_bytes;
    // The warp's head-dim slice (SLICED): its columns of dK, dV and dQ, and its `dSᵀ` tile.
    let slice = if SLICED { warp / 4 } else { 0 };
    let (col0, cols) = if SLICED {
        let col0 = BACKWARD_SLICE_COLS * slice;
        (col0, (d - col0).min(BACKWARD_SLICE_COLS))
    } else {
        (0, d)
    };
    let narrow = SLICED && cols < BACKWARD_SLICE_COLS;
    // dSᵀ: one key per row, one query per column.
    let ds_tile = SwizzledTile::new(ds_base + slice * bc * br * 2, br);
    // Per stage: `LSE · log2 e` of the block's rows, then their `D`.
    let stats = |st: u32| ds_base + ds_tiles * bc * br * 2 + st * 2 * br * 4;

    let cfg = TcBackwardConfig {
        head_dim: d,
        warps: WARPS as u32,
    };
    // The window and the score modifiers: `MODS` instances only (the host routes every call that
    // has one there), so the others compile without them. The K/V block visits only the Q
    // blocks of rows whose window reaches it.
    let window = if MODS { p.mods.window } else { Window::NONE };
    let windowed = !window.is_none();
    let keys_of = |row: u32| key_range(row, n_q, n_k, causal, window);
    let (first_block, end_block) = if windowed {
        window_q_blocks(k0, bc, (n_q, n_k), causal, window)
    } else {
        (cfg.first_q_block(k0, n_q, n_k, causal), n_q.div_ceil(br))
    };
    // Keys past the sequence's key length are seen by no row: their gradients are zeros.
    let per_head = if GENERAL && k0 >= n_k {
        0
    } else {
        end_block.saturating_sub(first_block)
    };
    let iters = per_head * group;
    // The K/V head recomputed at each use: no register for it across the loop.
    let head_of = |i: u32| head_here(s.heads_kv) * group + i / per_head;
    let row0_of = |i: u32| (first_block + i % per_head) * br;

    let fill = |i: u32, st: u32| {
        let (h, q0) = (head_of(i), row0_of(i));
        // SAFETY: each stage holds `br` rows; rows below n_q are inside Q and dO; the statistics
        // are padded to whole Q blocks, so every chunk is inside them, and a packed sequence's
        // rows are copied one by one (its first row need not start a 16-byte chunk).
        unsafe {
            // The sequence's first row recomputed here (`opaque`): hoisted out of the loop, Q's
            // and dO's offsets would each hold a register pair across it.
            let (batch, row0) = (opaque(seq.batch), opaque(seq.q_start));
            let rows = |base: u64, strides: &TensorStrides, chunks: u32| GlobalRows {
                base: base + 2 * strides.offset(batch, row0, h),
                stride: 2 * strides.seq,
                limit: n_q,
                chunks,
            };
            q_tile(st).fill_async(rows(p.q, &ts.q, real_chunks), q0, br, tid, threads);
            do_tile(st).fill_async(rows(p.d_o, &ts.d_o, v_chunks()), q0, br, tid, threads);
            let row = stats_row(h) + q0 as u64;
            if GENERAL {
                if tid < 2 * br {
                    let (which, r) = (tid / br, tid % br);
                    let base = if which == 0 { p.lse_log2 } else { p.d_sum };
                    let valid = q0 + r < n_q;
                    let src = if valid {
                        base + (row + r as u64) * 4
                    } else {
                        base
                    };
                    copy4(stats(st) + which * br * 4 + r * 4, src, valid);
                }
            } else {
                let chunks = br / 4;
                if tid < 2 * chunks {
                    let (which, c) = (tid / chunks, tid % chunks);
                    let base = if which == 0 { p.lse_log2 } else { p.d_sum };
                    copy16(
                        stats(st) + which * br * 4 + c * 16,
                        base + row * 4 + c as u64 * 16,
                        true,
                    );
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
        k_tile.fill_async(rows(p.k, &ts.k, real_chunks), k0, bc, tid, threads);
        v_tile.fill_async(rows(p.v, &ts.v, v_chunks()), k0, bc, tid, threads);
    }
    if iters > 0 {
        fill(0, 0);
    }

    let key_row = 16 * if SLICED { warp % 4 } else { warp };
    // A non-finite K row must not reach dQ = dS·K through a masked dS of 0 (0 · NaN). Its key
    // scores non-finite against every query: a row that allows it has a NaN LSE (its dS is NaN
    // whatever K holds) or scored it −∞ (P = 0, outside the row's support, contributing
    // nothing). So dQ may read K with non-finite elements as 0, while Sᵀ keeps the real K.
    // `k_poisoned` (block-uniform): the block's K tile holds a non-finite element; dQ then
    // sanitizes its K fragments (a rare, separate copy of the dQ product).
    let k_poisoned = iters > 0 && {
        wait_all();
        sync_threads();
        let mut bad = false;
        let mut at = 16 * tid;
        while at < kv_bytes {
            // SAFETY: inside the K tile.
            bad |= chunk_non_finite::<T>(unsafe { load_shared_16(smem + at) });
            at += 16 * threads;
        }
        sync_threads_or(bad)
    };
    let mut dk = [FragC::default(); ND];
    let mut dv = [FragC::default(); ND];
    let mut i = 0;
    while i < iters {
        // Block i has landed, and every warp is done with block i − 1 (its stage is refilled
        // next) and with the previous dSᵀ.
        wait_all();
        let st = if STAGES == 2 { i & 1 } else { 0 };
        let (h, q0) = (head_of(i), row0_of(i));
        // Rows past the sequence's end are masked too: copied as zeros, their statistics give
        // P = 1 (and past a packed sequence's end, its rows are the next sequence's).
        let past_end = GENERAL && q0 + br > n_q;
        let masked = past_end
            || if windowed {
                // Only pairs across a window edge, the causal diagonal or the key length.
                window_needs_mask((q0, k0), bc, (n_q, n_k), causal, window)
            } else {
                cfg.needs_mask(q0, k0, n_q, n_k, causal)
            };
        // Softcap and ALiBi of head h.
        let score_mod = if MODS {
            // SAFETY: the head's slope exists when ALiBi is on (validated by the host).
            unsafe { p.mods.for_head(h) }
        } else {
            ScoreMod::default()
        };
        let modified = score_mod.softcap != 0.0 || score_mod.slope != 0.0;
        // A non-finite Q row would reach dK as 0 · NaN through dSᵀ·Q. Every score of such a row
        // is non-finite, so its LSE is NaN or −∞ and the preprocess made it empty (P = 0,
        // D = 0; `nan_rows` writes a NaN row's gradients): zeroing its non-finite elements
        // changes no gradient. Each thread sanitizes the chunks it copied, before the barrier
        // that publishes them.
        // SAFETY: the thread's own copies of the stage's Q have landed (`wait_all`).
        unsafe { sanitize_own_chunks::<T, _>(&q_tile(st), br, tid, threads) };
        sync_threads();
        if STAGES == 2 && i + 1 < iters {
            fill(i + 1, st ^ 1);
        }
        // Fresh each iteration, so the dozens of swizzled addresses derived from the lane are
        // computed at their use instead of each holding a register across the loop (spills at
        // d = 128 otherwise).
        let lane = opaque(lane);
        let g = lane / 4;
        let (qt, dot) = (q_tile(st), do_tile(st));

        // Sᵀ = K·Qᵀ for the warp's 16 keys and Pᵀ from it, half the Q block (`NQP` n-tiles) at a
        // time so that only 16 score registers live beside dK and dV. Pᵀ, rounded, goes to the
        // warp's own rows of the dSᵀ tile: read back as A operands for dV and by element for dS
        // (which overwrites it in place).
        let (key_lo, key_hi) = (k0 + key_row + g, k0 + key_row + g + 8);
        // ALiBi's distance `|row + n_k − n_q − key|` of element e at query column `col`.
        // In i32, which holds every row and key (below 2^31, the host's validation).
        let distance = |col: u32, e: usize| {
            let row = (q0 + col + (e % 2) as u32) as i32;
            let key = if e < 2 { key_lo } else { key_hi } as i32;
            (row + (n_k as i32 - n_q as i32) - key).unsigned_abs() as f32
        };
        for half in 0..2 {
            let lane = opaque(lane);
            let t = lane % 4;
            let mut pt = [FragC::default(); NQP];
            for kk in 0..KD as u32 {
                // SAFETY: the warp's keys and chunks 2kk, 2kk + 1 are inside the K tile; the
                // half's queries inside the Q tile.
                unsafe {
                    let a = k_tile.load_a(key_row, kk, lane);
                    for np in 0..NQP / 2 {
                        let q = 16 * (half * NQP / 2 + np) as u32;
                        let [b0, b1] = qt.load_b_pair(q, kk, lane);
                        T::mma(&mut pt[2 * np], &a, &b0);
                        T::mma(&mut pt[2 * np + 1], &a, &b1);
                    }
                }
                pt.iter_mut().for_each(FragC::pin);
            }
            // Keys past n_k (zero rows of K) and causally hidden pairs are masked; rows past n_q
            // and rows with no allowed key have LSE·log2 e = +∞, so P = 0 there already
            // (general instances mask rows past n_q: `past_end`).
            each_fragment!(pt, |j, f| {
                let col = 8 * (half * NQP + j) as u32 + 2 * t;
                // SAFETY: columns col, col + 1 are inside the stage's statistics.
                let lse = unsafe { load_shared_f32x2(stats(st) + col * 4) };
                for e in 0..4 {
                    let x = f.0[e];
                    let score = if modified {
                        score_mod.apply_log2(x, p.scale_log2, distance(col, e))
                    } else {
                        x * p.scale_log2
                    };
                    f.0[e] = exp2(score - lse[e % 2]);
                }
                if masked || k_poisoned {
                    // Selects, not branches, so the loop unrolls and `pt` stays in registers.
                    // Rows past n_q too: their zero Q against a non-finite K scores NaN.
                    for e in 0..4 {
                        let key = if e < 2 { key_lo } else { key_hi };
                        let row = q0 + col + (e % 2) as u32;
                        let hidden = if windowed {
                            let (first, end) = keys_of(row);
                            row >= n_q || key < first || key >= end
                        } else {
                            row >= n_q || hidden(row, key, n_q, n_k, causal)
                        };
                        // MASKED (−0, which 2^x never is): dS below is 0 there, whatever dPᵀ.
                        f.0[e] = if hidden { MASKED } else { f.0[e] };
                    }
                }
            });
            for k in 0..NQP / 2 {
                let a = T::pack_a(&pt[2 * k], &pt[2 * k + 1]);
                let c = 2 * (half * NQP / 2 + k) as u32;
                // SAFETY: the warp's own key rows of the tile.
                unsafe { store_quad(ds_tile, key_row, c, g, t, a.0) };
            }
        }
        sync_warp();

        // Dropout: bit 4j + e of `keep` for element e of fragment j of the whole Q block.
        let dropping = GENERAL && p.dropout.enabled();
        let keep = if dropping {
            let keys = [key_lo, key_hi];
            transposed_keep_bits::<NQ>(&p.dropout, (seq.index, h), q0, lane % 4, keys)
        } else {
            0
        };

        // dV += (P∘Z)ᵀ·dO, without the factor 1/(1 − p) of Z (applied to dV at the end).
        let lane = opaque(lane);
        for k in 0..NQP as u32 {
            // SAFETY: the warp's key rows, queries 16k .. 16k + 16 of the tile; queries
            // 16k .. 16k + 16 and chunks 2dp, 2dp + 1 of the dO tile.
            unsafe {
                let a = ds_tile.load_a(key_row, k, lane);
                // The lane's own elements, in `pack_a`'s order (see `tile::mma`).
                let a = if dropping {
                    drop_operand(a, keep, k as usize)
                } else {
                    a
                };
                for dp in 0..ND / 2 {
                    // A guard, not a `break`: the loop unrolls and `dv` stays in registers.
                    if dp < ND / 4 || !narrow {
                        let chunk = col0 / 8 + 2 * dp as u32;
                        let [b0, b1] = dot.load_b_pair_trans(16 * k, chunk, lane);
                        T::mma(&mut dv[2 * dp], &a, &b0);
                        T::mma(&mut dv[2 * dp + 1], &a, &b1);
                    }
                }
            }
            dv.iter_mut().for_each(FragC::pin);
        }
        // Every lane's loads of Pᵀ are done before dSᵀ overwrites it.
        sync_warp();

        // dPᵀ = V·dOᵀ and dSᵀ = Pᵀ ∘ (dPᵀ∘Z − D) (Pᵀ as rounded for dV), half the Q block at a
        // time.
        for half in 0..2 {
            let lane = opaque(lane);
            let (g, t) = (lane / 4, lane % 4);
            let mut ds = [FragC::default(); NQP];
            for kk in 0..KD as u32 {
                // SAFETY: as for Sᵀ, with V and dO.
                unsafe {
                    let a = v_tile.load_a(key_row, kk, lane);
                    for np in 0..NQP / 2 {
                        let q = 16 * (half * NQP / 2 + np) as u32;
                        let [b0, b1] = dot.load_b_pair(q, kk, lane);
                        T::mma(&mut ds[2 * np], &a, &b0);
                        T::mma(&mut ds[2 * np + 1], &a, &b1);
                    }
                }
                ds.iter_mut().for_each(FragC::pin);
            }
            each_fragment!(ds, |j, f| {
                let jj = (half * NQP + j) as u32;
                let col = 8 * jj + 2 * t;
                let (lo_at, hi_at) = (
                    ds_tile.chunk_addr(key_row + g, jj) + 4 * t,
                    ds_tile.chunk_addr(key_row + g + 8, jj) + 4 * t,
                );
                // SAFETY: columns col, col + 1 are inside the stage's statistics; rows
                // key_row + g (+ 8), chunk jj inside the tile, written back by this lane only.
                unsafe {
                    let d_row = load_shared_f32x2(stats(st) + br * 4 + col * 4);
                    let (lo, hi) = (
                        T::unpack(load_shared_u32(lo_at)),
                        T::unpack(load_shared_u32(hi_at)),
                    );
                    let p_row = [lo[0], lo[1], hi[0], hi[1]];
                    // A masked Pᵀ gives dS = 0 even where dPᵀ (a masked V) or D (a NaN row)
                    // is not finite; so does a P of exactly 0 on such blocks: a key the row
                    // scored −∞ (a non-finite K, or an empty row) is outside its support.
                    let skip = masked || k_poisoned;
                    // The softcap's `1 − tanh²`, recovered from P (`ScoreMod::grad_from_p`; P
                    // as rounded for dV).
                    let lse = if score_mod.softcap != 0.0 {
                        load_shared_f32x2(stats(st) + col * 4)
                    } else {
                        [0.0; 2]
                    };
                    for e in 0..4 {
                        let grad = score_mod.grad_from_p(p_row[e], lse[e % 2], distance(col, e));
                        let z = if !dropping {
                            1.0
                        } else if (keep >> (4 * jj + e as u32)) & 1 != 0 {
                            p.dropout.keep_scale
                        } else {
                            0.0
                        };
                        let ds = p_row[e] * (f.0[e] * z - d_row[e % 2]) * grad;
                        f.0[e] = if skip && p_row[e] == 0.0 { 0.0 } else { ds };
                    }
                    store_shared_u32(lo_at, T::pack(f.0[0], f.0[1]));
                    store_shared_u32(hi_at, T::pack(f.0[2], f.0[3]));
                }
            });
        }
        sync_warp();

        // dK += dSᵀ·Q.
        let lane = opaque(lane);
        for k in 0..NQP as u32 {
            // SAFETY: the warp's key rows, queries 16k .. 16k + 16 of the dSᵀ tile; queries
            // 16k .. 16k + 16 and chunks 2dp, 2dp + 1 of the Q tile.
            unsafe {
                let a = ds_tile.load_a(key_row, k, lane);
                for dp in 0..ND / 2 {
                    // A guard, not a `break`: the loop unrolls and `dk` stays in registers.
                    if dp < ND / 4 || !narrow {
                        let chunk = col0 / 8 + 2 * dp as u32;
                        let [b0, b1] = qt.load_b_pair_trans(16 * k, chunk, lane);
                        T::mma(&mut dk[2 * dp], &a, &b0);
                        T::mma(&mut dk[2 * dp + 1], &a, &b1);
                    }
                }
            }
            dk.iter_mut().for_each(FragC::pin);
        }
        // dQ (deterministic instances): this Q block's semaphore counts the K/V blocks that have
        // added their part; its adds follow theirs, so dQ sums in key order on every run.
        let semaphore = |h: u32, q0: u32| {
            p.dq_semaphores + 4 * dq_semaphore(seq.batch * s.heads_q + h, q0 / br, p.n_q_pad)
        };
        if DETERMINISTIC && tid == 0 {
            // Blocks start in grid order and the waited-for blocks have lower x (same y and z):
            // each is resident or done, so the wait ends.
            // SAFETY: the semaphore of (b, h, Q block) exists; the preprocess zeroed it.
            unsafe { wait_equal_acquire(semaphore(h, q0), dq_adds_before(kv_block)) };
        }
        // dQ reads every warp's dSᵀ rows (and, deterministic, follows the earlier blocks' adds).
        sync_threads();
        if STAGES == 1 && i + 1 < iters {
            // One stage: every warp is done with it; block i + 1 lands while dQ runs.
            fill(i + 1, 0);
        }

        // dQ = dS·K over the block's keys. Warp w takes rows 16(w % 4) .. + 16 of the Q block
        // and n-tiles (w / 4)·ND / (WARPS / 4) onwards (SLICED: its slice's), `DQ` n-tiles (8
        // columns each) at a time, so that the dQ part fits beside dK and dV in registers.
        let acc_row = |row: u32| {
            // The accumulator is contiguous, in Q's shape.
            p.dq_accum + seq.q_offset(&s, row, h) as u64 * 4
        };
        let (row_group, share) = (warp % 4, if SLICED { ND } else { ND / (WARPS / 4) });
        let tile0 = if SLICED {
            col0 as usize / 8
        } else {
            (warp / 4) as usize * share
        };
        for part in 0..share / DQ {
            let lane = opaque(lane);
            let (g, t) = (lane / 4, lane % 4);
            let first = tile0 + DQ * part;
            if first as u32 >= real_chunks || SLICED && (DQ * part) as u32 >= cols / 8 {
                // Only padding columns left, or the narrow slice's end (warp-uniform).
                break;
            }
            let mut dq = [FragC::default(); DQ];
            for kk in 0..bc / 16 {
                // SAFETY: keys 16kk .. 16kk + 16 and the row group's 16 queries are inside the dSᵀ
                // tile; the keys and the part's chunks inside the K tile.
                unsafe {
                    let a = ds_tile.load_a_trans(16 * kk, 2 * row_group, lane);
                    for dp in 0..DQ / 2 {
                        let chunk = (first + 2 * dp) as u32;
                        let [mut b0, mut b1] = k_tile.load_b_pair_trans(16 * kk, chunk, lane);
                        if k_poisoned {
                            b0 = sanitize_frag::<T>(b0);
                            b1 = sanitize_frag::<T>(b1);
                        }
                        T::mma(&mut dq[2 * dp], &a, &b0);
                        T::mma(&mut dq[2 * dp + 1], &a, &b1);
                    }
                }
                dq.iter_mut().for_each(FragC::pin);
            }
            let row_lo = q0 + 16 * row_group + g;
            for (half, row) in [(0, row_lo), (2, row_lo + 8)] {
                if row < n_q {
                    let at = acc_row(row) + (32 * first + 8 * t as usize) as u64;
                    for (j, f) in dq.iter().enumerate() {
                        if (first + j) as u32 >= real_chunks {
                            // Padding columns (dQ there is 0): not in the accumulator.
                            break;
                        }
                        // SAFETY: row < n_q and columns 8(first + j) + 2t (+ 1) < dr are inside
                        // the accumulator.
                        unsafe {
                            red_add_f32(at + 32 * j as u64, f.0[half]);
                            red_add_f32(at + 32 * j as u64 + 4, f.0[half + 1]);
                        }
                    }
                }
            }
        }
        if DETERMINISTIC {
            // Every thread's adds precede the barrier; the release publishes them with the count.
            sync_threads();
            if tid == 0 {
                // SAFETY: as for the wait above.
                unsafe { release_store(semaphore(h, q0), dq_adds_before(kv_block) + 1) };
            }
        }
        i += 1;
    }

    // Stage dK (× τ) and dV (× 1/(1 − p) with dropout) through the warp's own rows of the K and V
    // tiles, once every warp is done reading them (dQ reads all keys) and their copies have
    // landed (no iteration ran).
    wait_all();
    sync_threads();
    let dv_scale = if GENERAL && p.dropout.enabled() {
        p.dropout.keep_scale
    } else {
        1.0
    };
    // SAFETY: the warp's 16 key rows and its slice's chunks are inside the tiles.
    unsafe {
        stage_slice::<T, ND>(k_tile, (key_row, col0, narrow), &dk, p.scale, lane);
        stage_slice::<T, ND>(v_tile, (key_row, col0, narrow), &dv, dv_scale, lane);
    }
    sync_warp();
    // The warp's rows, its slice's chunks (all of them unless SLICED).
    let chunks = cols / 8;
    for (tile, dst, strides, real) in [
        (k_tile, p.dk, &ts.dk, real_chunks),
        (v_tile, p.dv, &ts.dv, v_chunks()),
    ] {
        let (dst, stride) = (kv_at(dst, strides), 2 * strides.seq);
        for n in 0..(16 * ND as u32 / 32) {
            let idx = 32 * n + lane;
            if SLICED && idx >= 16 * chunks {
                // The narrow slice's end (warp-uniform).
                break;
            }
            let (r, c) = (idx / chunks, col0 / 8 + idx % chunks);
            let key = k0 + key_row + r;
            // SAFETY: the shared chunk is inside the tile; the global row is below n_k and the
            // chunk below the tensor's real head dim.
            unsafe {
                let v = load_shared_16(tile.chunk_addr(key_row + r, c));
                if key < seq.k_rows && c < real {
                    store_global_16(dst + key as u64 * stride + c as u64 * 16, v);
                }
            }
        }
    }
}

/// One entry point per (dtype, configuration), named `flash_tc_backward_<dtype>_d<d>_w<warps>` as
/// the host formats it, and for the default tiles `flash_tc_backward_general_…` (lengths and
/// dropout), `flash_tc_backward_mods_…` (the window and score modifiers),
/// `flash_tc_backward_general_mods_…` (both) and `flash_tc_backward_det_…` with bitwise
/// reproducible dQ (scale and causal only); the test checks that every `VARIANTS` entry exists.
macro_rules! entry_points {
    ($($name:ident => $t:ty, $cfg:expr, $general:literal, $mods:literal, $det:literal;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: TensorCoreBackwardParams) {
            // SAFETY: the host validated the buffers against `p` and launched the configuration's
            // grid, block and shared memory.
            unsafe {
                backward::<
                    $t,
                    { $cfg.head_dim as usize / 16 },
                    { $cfg.slice_cols() as usize / 8 },
                    { $cfg.block_rows() as usize / 8 },
                    { $cfg.block_rows() as usize / 16 },
                    { $cfg.warps as usize },
                    { $cfg.dq_tiles() as usize },
                    $general,
                    $mods,
                    $det,
                    { $cfg.sliced() },
                    { $cfg.stages() },
                >(&p)
            }
        }
    )*};
}

entry_points! {
    flash_tc_backward_bf16_d192_w8 => Bf16, TcBackwardConfig { head_dim: 192, warps: 8 }, false, false, false;
    flash_tc_backward_f16_d192_w8 => F16, TcBackwardConfig { head_dim: 192, warps: 8 }, false, false, false;
    flash_tc_backward_general_bf16_d192_w8 => Bf16, TcBackwardConfig { head_dim: 192, warps: 8 }, true, false, false;
    flash_tc_backward_general_f16_d192_w8 => F16, TcBackwardConfig { head_dim: 192, warps: 8 }, true, false, false;
    flash_tc_backward_mods_bf16_d192_w8 => Bf16, TcBackwardConfig { head_dim: 192, warps: 8 }, false, true, false;
    flash_tc_backward_mods_f16_d192_w8 => F16, TcBackwardConfig { head_dim: 192, warps: 8 }, false, true, false;
    flash_tc_backward_general_mods_bf16_d192_w8 => Bf16, TcBackwardConfig { head_dim: 192, warps: 8 }, true, true, false;
    flash_tc_backward_general_mods_f16_d192_w8 => F16, TcBackwardConfig { head_dim: 192, warps: 8 }, true, true, false;
    flash_tc_backward_det_bf16_d192_w8 => Bf16, TcBackwardConfig { head_dim: 192, warps: 8 }, false, false, true;
    flash_tc_backward_det_f16_d192_w8 => F16, TcBackwardConfig { head_dim: 192, warps: 8 }, false, false, true;
    flash_tc_backward_bf16_d256_w8 => Bf16, TcBackwardConfig { head_dim: 256, warps: 8 }, false, false, false;
    flash_tc_backward_f16_d256_w8 => F16, TcBackwardConfig { head_dim: 256, warps: 8 }, false, false, false;
    flash_tc_backward_general_bf16_d256_w8 => Bf16, TcBackwardConfig { head_dim: 256, warps: 8 }, true, false, false;
    flash_tc_backward_general_f16_d256_w8 => F16, TcBackwardConfig { head_dim: 256, warps: 8 }, true, false, false;
    flash_tc_backward_mods_bf16_d256_w8 => Bf16, TcBackwardConfig { head_dim: 256, warps: 8 }, false, true, false;
    flash_tc_backward_mods_f16_d256_w8 => F16, TcBackwardConfig { head_dim: 256, warps: 8 }, false, true, false;
    flash_tc_backward_general_mods_bf16_d256_w8 => Bf16, TcBackwardConfig { head_dim: 256, warps: 8 }, true, true, false;
    flash_tc_backward_general_mods_f16_d256_w8 => F16, TcBackwardConfig { head_dim: 256, warps: 8 }, true, true, false;
    flash_tc_backward_det_bf16_d256_w8 => Bf16, TcBackwardConfig { head_dim: 256, warps: 8 }, false, false, true;
    flash_tc_backward_det_f16_d256_w8 => F16, TcBackwardConfig { head_dim: 256, warps: 8 }, false, false, true;
}
